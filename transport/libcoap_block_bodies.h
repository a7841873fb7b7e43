// What libcoap 4.3.1 keeps of a session's block-wise request bodies, kept short.
//
// With COAP_BLOCK_USE_LIBCOAP and without COAP_BLOCK_SINGLE_BODY (coap_server.cc assembles
// bodies itself), libcoap still records every Block1 body a session starts (a
// coap_lg_srcv_t, found again by resource and Request-Tag) and forgets it only 93 s
// (MAX_TRANSMIT_WAIT) after its last block. A libcoap client sends each body with a new
// Request-Tag, so every update a device posts leaves one record behind: at 600 updates/s
// that is ~56,000 records, walked on every pass of the event loop (coap_io_prepare_epoll's
// block-wise timeouts) and, per session, on every block that arrives. Nothing bounds them,
// so a device could also grow the server's memory by starting bodies it never finishes.
// The server assembles one body per session (a new block 0 starts it afresh), so it needs
// at most the record of the body in progress: the newest one.
#pragma once

#include <coap3/coap.h>

#ifdef __cplusplus
extern "C" {
#endif

// Frees every block-wise request record of `session` but the newest (libcoap prepends new
// ones). Call only from a resource handler of the session's own context, where libcoap
// holds no pointer to a record but possibly the newest; returns how many were freed.
size_t edgetrain_forget_older_request_bodies(coap_session_t* session);

#ifdef __cplusplus
}
#endif
