/* fuzz_proto: bytes as a request line (inference and admin op sets) and as a server event; what parses is re-encoded and must parse to the same request. */
#include <string.h>

#include "fuzz.h"
#include "proto.h"

static void fz_request(const uint8_t *data, size_t size, int admin)
{
    proto_req_t req;
    json_t *id = NULL;
    char err[512];
    err[0] = '\0';
    int rc = proto_parse_request((const char *)data, size, admin, &req, &id, err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(rc == -PROTO_E_BAD_JSON || rc == -PROTO_E_BAD_REQUEST, "rc %d", rc);
        FUZZ_CHECK(err[0], "no message for rc %d", rc);
        FUZZ_CHECK(!id || json_is_string(id) || json_is_integer(id), "odd id type");
        /* the error line the server would send for it */
        char *line = proto_encode_error(id, (proto_err_t)-rc, err, 0);
        FUZZ_CHECK(line, "encode_error");
        proto_event_t ev;
        FUZZ_CHECK(proto_parse_event(line, strlen(line) - 1, &ev, err, sizeof err) == 0 &&
                       ev.kind == PROTO_EV_ERROR,
                   "own error line does not parse: %s", line);
        proto_event_free(&ev);
        free(line);
        json_decref(id);
        return;
    }
    FUZZ_CHECK(id == NULL, "id_out set on success");
    FUZZ_CHECK(proto_op_name(req.op) != NULL, "op %d", (int)req.op);
    char *a = proto_encode_request(&req);
    FUZZ_CHECK(a, "encode_request of a parsed request (op %s)", proto_op_name(req.op));
    size_t la = strlen(a);
    FUZZ_CHECK(la && a[la - 1] == '\n', "no newline");
    proto_req_t again;
    rc = proto_parse_request(a, la - 1, admin, &again, NULL, err, sizeof err);
    FUZZ_CHECK(rc == 0, "re-encoded request does not parse: %s\n%s", err, a);
    char *b = proto_encode_request(&again);
    FUZZ_CHECK(b && strcmp(a, b) == 0, "encodings differ:\n%s%s", a, b ? b : "(null)\n");
    free(a);
    free(b);
    proto_req_free(&again);
    proto_req_free(&req);
}

static void fz_event(const uint8_t *data, size_t size)
{
    proto_event_t ev;
    char err[512];
    if (proto_parse_event((const char *)data, size, &ev, err, sizeof err) == 0) {
        FUZZ_CHECK(ev.root && json_is_object(ev.root), "event root");
        FUZZ_CHECK(ev.kind >= PROTO_EV_TOKEN && ev.kind <= PROTO_EV_PROGRESS, "kind %d",
                   (int)ev.kind);
        proto_event_free(&ev);
    }
}

/* Text (any bytes) through the event encoders: the lines must parse back. */
static void fz_encoders(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return;
    memcpy(text, data, size);
    text[size] = '\0';
    json_t *id = json_string("fz");
    proto_timing_t t = {1.5, 2.25, 3.125, 4.0625, 1};
    char *lines[4] = {
        proto_encode_token(id, text, 7, -1, NULL),
        proto_encode_done(id, text, text, 1, 2, 0, &t, NULL),
        proto_encode_error(id, PROTO_E_BAD_REQUEST, text, 0),
        proto_encode_progress(id, text, 1, 2),
    };
    for (int i = 0; i < 4; i++) {
        FUZZ_CHECK(lines[i], "encoder %d", i);
        proto_event_t ev;
        char err[256];
        size_t n = strlen(lines[i]);
        FUZZ_CHECK(proto_parse_event(lines[i], n - 1, &ev, err, sizeof err) == 0,
                   "encoder %d's line does not parse: %s: %s", i, err, lines[i]);
        FUZZ_CHECK(json_equal(ev.id, id), "id lost");
        proto_event_free(&ev);
        free(lines[i]);
    }
    json_decref(id);
    free(text);
}

int fuzz_proto(const uint8_t *data, size_t size)
{
    fz_request(data, size, 0);
    fz_request(data, size, 1);
    fz_event(data, size);
    if (size <= 4096)
        fz_encoders(data, size);
    return 0;
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_proto(data, size);
}
#endif
