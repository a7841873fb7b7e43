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
// at most the record of the body in progress, and none once its last block is in: a
// session without records is not even visited by that walk.
#pragma once

#include <coap3/coap.h>

#ifdef __cplusplus
extern "C" {
#endif

// Frees the block-wise request records of `session`: all of them, or all but the newest
// (libcoap prepends new ones) while a body is still arriving, since libcoap needs its record
// to answer its next block. Call only from a resource handler of the session's own
// context: libcoap then holds no pointer to a record, or to the newest one of a body whose
// last block has not come yet. Returns how many were freed.
size_t edgetrain_forget_request_bodies(coap_session_t* session, int keep_newest);

#ifdef __cplusplus
}
#endif
