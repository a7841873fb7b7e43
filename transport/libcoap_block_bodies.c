// The only file of edgetrain that reads libcoap's private structures (libcoap_block_bodies.h
// says why). C, because libcoap's internal headers are C. They and the coap_config.h of the
// very build that is linked are installed by toolchains/setup-deps.sh (libcoap-host,
// libcoap-aarch64) under the prefix's internal/ directory.
#include "transport/libcoap_block_bodies.h"

#include <coap3/coap_internal.h>

// The layout read here is 4.3.1's: coap_server.cc refuses to compile against another version.

size_t edgetrain_forget_request_bodies(coap_session_t* session, int keep_newest) {
  if (session == NULL || session->lg_srcv == NULL) return 0;
  coap_lg_srcv_t* doomed = session->lg_srcv;
  if (keep_newest) {
    doomed = session->lg_srcv->next;
    session->lg_srcv->next = NULL;
  } else {
    session->lg_srcv = NULL;
  }
  size_t freed = 0;
  while (doomed != NULL) {
    coap_lg_srcv_t* next = doomed->next;
    coap_block_delete_lg_srcv(session, doomed);
    doomed = next;
    ++freed;
  }
  return freed;
}
