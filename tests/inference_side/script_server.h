/* script_server.h - a small HTTP server on 127.0.0.1 for the fetching
 * layer's tests (test_http_fetch.c), whose answers are scripted by path:
 *
 *   /flaky/N     503 for the first N requests to it, then 200 "recovered"
 *   /missing     404            /gone       410
 *   /later/N     404 for the first N requests, then 200 "here now"
 *   /blob        SS_BLOB_SIZE pattern bytes (ss_blob_byte), strong ETag
 *                "\"v1\"", honours Range "bytes=A-" / "bytes=A-B" and
 *                If-Range (a 200 with the whole body when the tag differs)
 *   /cut/K       as /blob, but the first request's body is cut (the
 *                connection closed) after K bytes
 *   /etag2/K     as /cut/K, whose ETag changes after the first request
 *   /wrongrange  a 206 whose Content-Range starts at 0, whatever was asked
 *   /slow        1 byte every 10 ms of a long body (for stopping)
 *   POST /post   201 "posted" (a GET is 405)
 *
 * It records each request's method, path, Range and If-Range. */
#ifndef PULSE_SCRIPT_SERVER_H
#define PULSE_SCRIPT_SERVER_H

#include <stddef.h>
#include <stdint.h>

#define SS_BLOB_SIZE 300000u
#define SS_MAX_LOG 256

typedef struct script_server script_server;

typedef struct {
  char method[8];
  char path[64];
  char range[64];    /* "" when absent */
  char if_range[64]; /* "" when absent */
} ss_request;

/** Byte i of /blob. */
static inline uint8_t ss_blob_byte(uint64_t i) {
  return (uint8_t)((i * 2654435761u) >> 13);
}

/** Starts a server on a kernel-chosen port; NULL on failure. */
script_server *ss_start(void);

/** Stops and frees (NULL is fine). */
void ss_stop(script_server *s);

uint16_t ss_port(const script_server *s);

/** Requests seen so far; copies up to cap of them into log (may be NULL). */
size_t ss_requests(script_server *s, ss_request *log, size_t cap);

#endif
