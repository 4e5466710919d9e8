# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled OTLP decoder: protobuf wire format straight into column lists.

Same output as the pure-Python path in ``decode.py`` (an equivalence test holds them to it),
without building a protobuf object tree or a dict per attribute map: attribute maps, events
and links are written as JSON text directly. Traces and logs only (the high-volume signals);
metrics keep the Python path. Raises ``WireError`` (a ValueError) for malformed input.

One known difference: a record whose attribute map repeats a key keeps both in its JSON text
(the Python path's dict keeps the last); OTLP senders do not repeat keys.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.math cimport isinf, isnan
from libc.string cimport memcpy

from cpython.unicode cimport PyUnicode_DecodeUTF8

import binascii


class WireError(ValueError):
    pass


cdef extern from "Python.h":
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int* ptype) except NULL
    void PyMem_Free(void* p)
    int Py_DTSF_ADD_DOT_0


cdef class _Json:
    """A growable byte buffer that JSON text is written into."""
    cdef char* data
    cdef Py_ssize_t length
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.cap = 1024
        self.length = 0
        self.data = <char*>malloc(self.cap)
        if self.data == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.data)

    cdef inline void reset(self):
        self.length = 0

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t need = self.length + n
        cdef char* grown
        if need <= self.cap:
            return 0
        while self.cap < need:
            self.cap *= 2
        grown = <char*>realloc(self.data, self.cap)
        if grown == NULL:
            raise MemoryError()
        self.data = grown
        return 0

    cdef inline int put(self, char c) except -1:
        if self.length + 1 > self.cap:
            self.reserve(1)
        self.data[self.length] = c
        self.length += 1
        return 0

    cdef int write(self, const char* s, Py_ssize_t n) except -1:
        self.reserve(n)
        memcpy(self.data + self.length, s, n)
        self.length += n
        return 0

    cdef int string(self, const unsigned char* s, Py_ssize_t n) except -1:
        """A JSON string from UTF-8 bytes (validated), escaping what JSON requires."""
        cdef Py_ssize_t i
        cdef unsigned char c
        cdef const char* hexdigits = b"0123456789abcdef"
        _check_utf8(s, n)
        self.reserve(n + 2)
        self.put(34)
        for i in range(n):
            c = s[i]
            if c == 34 or c == 92:
                self.put(92)
                self.put(c)
            elif c < 0x20:
                self.write(b"\\u00", 4)
                self.put(hexdigits[c >> 4])
                self.put(hexdigits[c & 15])
            else:
                self.put(c)
        self.put(34)
        return 0

    cdef int integer(self, int64_t v) except -1:
        cdef char buf[24]
        cdef int n = 0, i
        cdef uint64_t u
        cdef bint negative = v < 0
        u = <uint64_t>(-(v + 1)) + 1 if negative else <uint64_t>v
        while True:
            buf[n] = <char>(48 + u % 10)
            n += 1
            u //= 10
            if u == 0:
                break
        self.reserve(n + 1)
        if negative:
            self.data[self.length] = 45
            self.length += 1
        for i in range(n):
            self.data[self.length + i] = buf[n - 1 - i]
        self.length += n
        return 0

    cdef int double(self, double v) except -1:
        cdef char* text
        if isnan(v) or isinf(v):
            self.write(b"null", 4)  # what orjson writes for NaN and infinities
            return 0
        text = PyOS_double_to_string(v, b"r", 0, Py_DTSF_ADD_DOT_0, NULL)
        try:
            self.write(text, len(<bytes>text))
        finally:
            PyMem_Free(text)
        return 0

    cdef str value(self):
        return PyUnicode_DecodeUTF8(self.data, self.length, NULL)


cdef int _check_utf8(const unsigned char* s, Py_ssize_t n) except -1:
    cdef Py_ssize_t i = 0
    cdef unsigned char c
    cdef int extra, k
    cdef uint32_t cp
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            extra = 1
            cp = c & 0x1F
        elif 0xE0 <= c <= 0xEF:
            extra = 2
            cp = c & 0x0F
        elif 0xF0 <= c <= 0xF4:
            extra = 3
            cp = c & 0x07
        else:
            raise WireError("string field is not valid UTF-8")
        if i + extra > n - 1:
            raise WireError("string field is not valid UTF-8")
        for k in range(1, extra + 1):
            if (s[i + k] & 0xC0) != 0x80:
                raise WireError("string field is not valid UTF-8")
            cp = (cp << 6) | (s[i + k] & 0x3F)
        if (extra == 2 and (cp < 0x800 or 0xD800 <= cp <= 0xDFFF)) or \
                (extra == 3 and (cp < 0x10000 or cp > 0x10FFFF)):
            raise WireError("string field is not valid UTF-8")
        i += extra + 1
    return 0


cdef struct Reader:
    const unsigned char* p
    Py_ssize_t pos
    Py_ssize_t end


cdef inline uint64_t _varint(Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if r.pos >= r.end:
            raise WireError("truncated varint")
        b = r.p[r.pos]
        r.pos += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            return result
        shift += 7
        if shift >= 70:
            raise WireError("varint too long")


cdef inline uint64_t _fixed64(Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t v = 0
    cdef int i
    if r.pos + 8 > r.end:
        raise WireError("truncated fixed64")
    for i in range(8):
        v |= (<uint64_t>r.p[r.pos + i]) << (8 * i)
    r.pos += 8
    return v


cdef inline uint32_t _fixed32(Reader* r) except? 0xFFFFFFFF:
    cdef uint32_t v = 0
    cdef int i
    if r.pos + 4 > r.end:
        raise WireError("truncated fixed32")
    for i in range(4):
        v |= (<uint32_t>r.p[r.pos + i]) << (8 * i)
    r.pos += 4
    return v


cdef inline Reader _sub(Reader* r) except *:
    """The length-delimited field at the cursor, as its own reader; the cursor moves past."""
    cdef uint64_t n = _varint(r)
    cdef Reader out
    if n > <uint64_t>(r.end - r.pos):
        raise WireError("length-delimited field runs past its message")
    out.p = r.p
    out.pos = r.pos
    out.end = r.pos + <Py_ssize_t>n
    r.pos = out.end
    return out


cdef int _skip(Reader* r, int wire) except -1:
    if wire == 0:
        _varint(r)
    elif wire == 1:
        _fixed64(r)
    elif wire == 2:
        _sub(r)
    elif wire == 5:
        _fixed32(r)
    else:
        raise WireError(f"unsupported wire type {wire}")
    return 0


cdef inline bytes _bytes(Reader* r):
    cdef Reader s = _sub(r)
    return r.p[s.pos:s.end]


cdef inline str _str(Reader* r):
    cdef Reader s = _sub(r)
    _check_utf8(r.p + s.pos, s.end - s.pos)
    return PyUnicode_DecodeUTF8(<const char*>(r.p + s.pos), s.end - s.pos, NULL)


cdef int _any_value(Reader r, _Json out, int depth) except -1:
    """Write one AnyValue (its message bytes in ``r``) as JSON; empty is null."""
    cdef uint64_t key, bits
    cdef int field, wire
    cdef Reader s
    cdef bint first
    cdef double d
    cdef Py_ssize_t start = out.length
    cdef bint wrote = False
    if depth > 64:
        raise WireError("values nested too deeply")
    while r.pos < r.end:
        key = _varint(&r)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if not ((field == 1 and wire == 2) or (field == 2 and wire == 0)
                or (field == 3 and wire == 0) or (field == 4 and wire == 1)
                or (5 <= field <= 7 and wire == 2)):
            _skip(&r, wire)
            continue
        # A oneof: if a sender repeats it, the last one wins, as in protobuf.
        out.length = start
        wrote = True
        if field == 1:
            s = _sub(&r)
            out.string(r.p + s.pos, s.end - s.pos)
        elif field == 2:
            if _varint(&r):
                out.write(b"true", 4)
            else:
                out.write(b"false", 5)
        elif field == 3:
            out.integer(<int64_t>_varint(&r))
        elif field == 4:
            bits = _fixed64(&r)
            memcpy(&d, &bits, 8)
            out.double(d)
        elif field == 5:  # ArrayValue { repeated AnyValue values = 1 }
            s = _sub(&r)
            out.put(91)
            first = True
            while s.pos < s.end:
                key = _varint(&s)
                if (key >> 3) == 1 and (key & 7) == 2:
                    if not first:
                        out.put(44)
                    first = False
                    _any_value(_sub(&s), out, depth + 1)
                else:
                    _skip(&s, <int>(key & 7))
            out.put(93)
        elif field == 6:  # KeyValueList { repeated KeyValue values = 1 }
            _kv_object(_sub(&r), out, 1, depth + 1)
        else:
            s = _sub(&r)
            encoded = binascii.b2a_base64(r.p[s.pos:s.end], newline=False)
            out.put(34)
            out.write(encoded, len(encoded))
            out.put(34)
    if not wrote:
        out.write(b"null", 4)
    return 0


cdef int _kv_object(Reader r, _Json out, int field_no, int depth) except -1:
    """Write the repeated KeyValue field ``field_no`` of a message as a JSON object."""
    cdef uint64_t key
    cdef bint first = True
    out.put(123)
    while r.pos < r.end:
        key = _varint(&r)
        if <int>(key >> 3) == field_no and (key & 7) == 2:
            if not first:
                out.put(44)
            first = False
            _one_kv(_sub(&r), out, depth)
        else:
            _skip(&r, <int>(key & 7))
    out.put(125)
    return 0


cdef tuple _resource(Reader r, int field_no):
    """(service.name, attributes JSON or None) of a Resource message."""
    cdef _Json out = _Json()
    cdef str json_text
    _kv_object(r, out, field_no, 0)
    json_text = out.value()
    if json_text == "{}":
        return None, None
    import orjson
    attrs = orjson.loads(json_text)
    service = attrs.get("service.name")
    # Re-serialised so duplicate keys collapse exactly as the Python path's dict does.
    return service, orjson.dumps(attrs).decode()


cdef tuple _scope(Reader r):
    cdef uint64_t key
    name = None
    version = None
    while r.pos < r.end:
        key = _varint(&r)
        if (key >> 3) == 1 and (key & 7) == 2:
            name = _str(&r) or None
        elif (key >> 3) == 2 and (key & 7) == 2:
            version = _str(&r) or None
        else:
            _skip(&r, <int>(key & 7))
    return name, version


_KINDS = (None, "internal", "server", "client", "producer", "consumer")
_STATUS = ("unset", "ok", "error")


def decode_spans(const unsigned char[:] body, dict cols):
    """Fill ``cols`` (the spans table's column lists) from an ExportTraceServiceRequest.
    Returns (rejected count, first rejection reason)."""
    cdef Reader top, rs, ss, sp, s, ev
    cdef uint64_t key, start, end, kind, code
    cdef int field, wire, n_valid
    cdef _Json attrs = _Json()
    cdef _Json events = _Json()
    cdef _Json links = _Json()
    cdef _Json tmp = _Json()
    cdef int rejected = 0
    cdef bint n_attrs, n_events, n_links
    first_reason = None
    if body.shape[0] == 0:
        return 0, None
    top.p = &body[0]
    top.pos = 0
    top.end = body.shape[0]
    c_trace, c_span, c_parent = cols["trace_id"], cols["span_id"], cols["parent_span_id"]
    c_state, c_name, c_kind = cols["trace_state"], cols["name"], cols["kind"]
    c_start, c_end, c_dur = cols["start_time"], cols["end_time"], cols["duration_ns"]
    c_code, c_msg, c_attrs = cols["status_code"], cols["status_message"], cols["attributes"]
    c_events, c_links, c_dropped = cols["events"], cols["links"], cols["dropped_attributes_count"]
    c_service, c_res = cols["service_name"], cols["resource_attributes"]
    c_scope, c_scope_v = cols["scope_name"], cols["scope_version"]
    while top.pos < top.end:
        key = _varint(&top)
        if (key >> 3) != 1 or (key & 7) != 2:
            _skip(&top, <int>(key & 7))
            continue
        rs = _sub(&top)
        service, res_json = None, None
        scopes = []
        while rs.pos < rs.end:
            key = _varint(&rs)
            if (key >> 3) == 1 and (key & 7) == 2:
                service, res_json = _resource(_sub(&rs), 1)
            elif (key >> 3) == 2 and (key & 7) == 2:
                s = _sub(&rs)
                scopes.append((s.pos, s.end))
            else:
                _skip(&rs, <int>(key & 7))
        for scope_start, scope_end in scopes:
            ss.p = top.p
            ss.pos = scope_start
            ss.end = scope_end
            scope_name, scope_version = None, None
            n_valid = 0
            while ss.pos < ss.end:
                key = _varint(&ss)
                field = <int>(key >> 3)
                wire = <int>(key & 7)
                if field == 1 and wire == 2:
                    scope_name, scope_version = _scope(_sub(&ss))
                elif field == 2 and wire == 2:
                    sp = _sub(&ss)
                    trace_id = b""
                    span_id = b""
                    parent = b""
                    state = ""
                    name = ""
                    kind = 0
                    start = 0
                    end = 0
                    dropped = 0
                    code = 0
                    message = ""
                    attrs.reset(); events.reset(); links.reset()
                    n_attrs = n_events = n_links = False
                    attrs.put(123); events.put(91); links.put(91)
                    while sp.pos < sp.end:
                        key = _varint(&sp)
                        field = <int>(key >> 3)
                        wire = <int>(key & 7)
                        if field == 1 and wire == 2:
                            trace_id = _bytes(&sp)
                        elif field == 2 and wire == 2:
                            span_id = _bytes(&sp)
                        elif field == 3 and wire == 2:
                            state = _str(&sp)
                        elif field == 4 and wire == 2:
                            parent = _bytes(&sp)
                        elif field == 5 and wire == 2:
                            name = _str(&sp)
                        elif field == 6 and wire == 0:
                            kind = _varint(&sp)
                        elif field == 7 and wire == 1:
                            start = _fixed64(&sp)
                        elif field == 8 and wire == 1:
                            end = _fixed64(&sp)
                        elif field == 9 and wire == 2:
                            if n_attrs:
                                attrs.put(44)
                            n_attrs = True
                            _one_kv(_sub(&sp), attrs)
                        elif field == 10 and wire == 0:
                            dropped = _varint(&sp)
                        elif field == 11 and wire == 2:
                            if n_events:
                                events.put(44)
                            n_events = True
                            _event(_sub(&sp), events)
                        elif field == 13 and wire == 2:
                            if n_links:
                                links.put(44)
                            n_links = True
                            _link(_sub(&sp), links)
                        elif field == 15 and wire == 2:
                            s = _sub(&sp)
                            while s.pos < s.end:
                                key = _varint(&s)
                                if (key >> 3) == 2 and (key & 7) == 2:
                                    message = _str(&s)
                                elif (key >> 3) == 3 and (key & 7) == 0:
                                    code = _varint(&s)
                                else:
                                    _skip(&s, <int>(key & 7))
                        else:
                            _skip(&sp, wire)
                    if len(trace_id) != 16:
                        reason = f"trace_id must be 16 bytes, got {len(trace_id)}"
                    elif len(span_id) != 8:
                        reason = f"span_id must be 8 bytes, got {len(span_id)}"
                    elif parent and len(parent) != 8:
                        reason = f"parent_span_id must be 8 bytes, got {len(parent)}"
                    elif not start:
                        reason = f"span {span_id.hex()} has no start time"
                    else:
                        reason = None
                    if reason is not None:
                        rejected += 1
                        if first_reason is None:
                            first_reason = reason
                        continue
                    n_valid += 1
                    attrs.put(125); events.put(93); links.put(93)
                    c_trace.append(trace_id.hex())
                    c_span.append(span_id.hex())
                    c_parent.append(parent.hex() if parent else None)
                    c_state.append(state or None)
                    c_name.append(name)
                    c_kind.append(_KINDS[kind] if kind < 6 else None)
                    c_start.append(start)
                    c_end.append(end or None)
                    c_dur.append(<int64_t>(end - start) if end else None)
                    c_code.append(_STATUS[code] if code < 3 else None)
                    c_msg.append(message or None)
                    c_attrs.append(attrs.value() if n_attrs else None)
                    c_events.append(events.value() if n_events else None)
                    c_links.append(links.value() if n_links else None)
                    c_dropped.append(dropped)
                else:
                    _skip(&ss, wire)
            c_service.extend([service] * n_valid)
            c_res.extend([res_json] * n_valid)
            c_scope.extend([scope_name] * n_valid)
            c_scope_v.extend([scope_version] * n_valid)
    return rejected, first_reason


cdef int _one_kv(Reader kv, _Json out, int depth=0) except -1:
    cdef uint64_t key
    cdef Reader s, value
    cdef bint has_value = False
    cdef Py_ssize_t kstart = -1, kend = -1
    while kv.pos < kv.end:
        key = _varint(&kv)
        if (key >> 3) == 1 and (key & 7) == 2:
            s = _sub(&kv)
            kstart = s.pos
            kend = s.end
        elif (key >> 3) == 2 and (key & 7) == 2:
            value = _sub(&kv)
            has_value = True
        else:
            _skip(&kv, <int>(key & 7))
    if kstart < 0:
        out.write(b'""', 2)
    else:
        out.string(kv.p + kstart, kend - kstart)
    out.put(58)
    if has_value:
        _any_value(value, out, depth)
    else:
        out.write(b"null", 4)
    return 0


cdef int _event(Reader r, _Json out) except -1:
    cdef uint64_t key, t = 0
    cdef _Json attrs = _Json()
    cdef bint n_attrs = False
    name = ""
    attrs.put(123)
    while r.pos < r.end:
        key = _varint(&r)
        if (key >> 3) == 1 and (key & 7) == 1:
            t = _fixed64(&r)
        elif (key >> 3) == 2 and (key & 7) == 2:
            name = _str(&r)
        elif (key >> 3) == 3 and (key & 7) == 2:
            if n_attrs:
                attrs.put(44)
            n_attrs = True
            _one_kv(_sub(&r), attrs)
        else:
            _skip(&r, <int>(key & 7))
    attrs.put(125)
    out.write(b'{"time":', 8)
    out.integer(<int64_t>t)
    out.write(b',"name":', 8)
    encoded = name.encode()
    out.string(encoded, len(encoded))
    out.write(b',"attributes":', 14)
    out.write(attrs.data, attrs.length)
    out.put(125)
    return 0


cdef int _link(Reader r, _Json out) except -1:
    cdef uint64_t key
    cdef _Json attrs = _Json()
    cdef bint n_attrs = False
    trace_id = b""
    span_id = b""
    state = ""
    attrs.put(123)
    while r.pos < r.end:
        key = _varint(&r)
        if (key >> 3) == 1 and (key & 7) == 2:
            trace_id = _bytes(&r)
        elif (key >> 3) == 2 and (key & 7) == 2:
            span_id = _bytes(&r)
        elif (key >> 3) == 3 and (key & 7) == 2:
            state = _str(&r)
        elif (key >> 3) == 4 and (key & 7) == 2:
            if n_attrs:
                attrs.put(44)
            n_attrs = True
            _one_kv(_sub(&r), attrs)
        else:
            _skip(&r, <int>(key & 7))
    attrs.put(125)
    out.write(b'{"trace_id":"', 13)
    t = trace_id.hex().encode()
    out.write(t, len(t))
    out.write(b'","span_id":"', 13)
    t = span_id.hex().encode()
    out.write(t, len(t))
    out.write(b'","trace_state":', 16)
    t = state.encode()
    out.string(t, len(t))
    out.write(b',"attributes":', 14)
    out.write(attrs.data, attrs.length)
    out.put(125)
    return 0


def decode_logs(const unsigned char[:] body, dict cols):
    """Fill ``cols`` (the logs table's column lists) from an ExportLogsServiceRequest.
    Returns (rejected count, first rejection reason)."""
    cdef Reader top, rl, sl, lr, s
    cdef uint64_t key, t, observed, severity, flags, dropped
    cdef int field, wire, n_valid, rejected = 0
    cdef _Json attrs = _Json()
    cdef _Json bodybuf = _Json()
    cdef bint n_attrs, has_body
    cdef Reader body_r
    first_reason = None
    if body.shape[0] == 0:
        return 0, None
    top.p = &body[0]
    top.pos = 0
    top.end = body.shape[0]
    c_time, c_obs, c_trace, c_span = cols["time"], cols["observed_time"], cols["trace_id"], \
        cols["span_id"]
    c_sev, c_sevt, c_body, c_event = cols["severity_number"], cols["severity_text"], \
        cols["body"], cols["event_name"]
    c_attrs, c_flags = cols["attributes"], cols["flags"]
    c_service, c_res = cols["service_name"], cols["resource_attributes"]
    c_scope, c_scope_v = cols["scope_name"], cols["scope_version"]
    while top.pos < top.end:
        key = _varint(&top)
        if (key >> 3) != 1 or (key & 7) != 2:
            _skip(&top, <int>(key & 7))
            continue
        rl = _sub(&top)
        service, res_json = None, None
        scopes = []
        while rl.pos < rl.end:
            key = _varint(&rl)
            if (key >> 3) == 1 and (key & 7) == 2:
                service, res_json = _resource(_sub(&rl), 1)
            elif (key >> 3) == 2 and (key & 7) == 2:
                s = _sub(&rl)
                scopes.append((s.pos, s.end))
            else:
                _skip(&rl, <int>(key & 7))
        for scope_start, scope_end in scopes:
            sl.p = top.p
            sl.pos = scope_start
            sl.end = scope_end
            scope_name, scope_version = None, None
            n_valid = 0
            while sl.pos < sl.end:
                key = _varint(&sl)
                field = <int>(key >> 3)
                wire = <int>(key & 7)
                if field == 1 and wire == 2:
                    scope_name, scope_version = _scope(_sub(&sl))
                elif field == 2 and wire == 2:
                    lr = _sub(&sl)
                    t = observed = severity = flags = 0
                    trace_id = b""
                    span_id = b""
                    sev_text = ""
                    event = ""
                    attrs.reset()
                    attrs.put(123)
                    n_attrs = False
                    has_body = False
                    while lr.pos < lr.end:
                        key = _varint(&lr)
                        field = <int>(key >> 3)
                        wire = <int>(key & 7)
                        if field == 1 and wire == 1:
                            t = _fixed64(&lr)
                        elif field == 11 and wire == 1:
                            observed = _fixed64(&lr)
                        elif field == 2 and wire == 0:
                            severity = _varint(&lr)
                        elif field == 3 and wire == 2:
                            sev_text = _str(&lr)
                        elif field == 5 and wire == 2:
                            body_r = _sub(&lr)
                            has_body = True
                        elif field == 6 and wire == 2:
                            if n_attrs:
                                attrs.put(44)
                            n_attrs = True
                            _one_kv(_sub(&lr), attrs)
                        elif field == 8 and wire == 5:
                            flags = _fixed32(&lr)
                        elif field == 9 and wire == 2:
                            trace_id = _bytes(&lr)
                        elif field == 10 and wire == 2:
                            span_id = _bytes(&lr)
                        elif field == 12 and wire == 2:
                            event = _str(&lr)
                        else:
                            _skip(&lr, wire)
                    if trace_id and len(trace_id) != 16:
                        reason = f"trace_id must be 16 bytes, got {len(trace_id)}"
                    elif span_id and len(span_id) != 8:
                        reason = f"span_id must be 8 bytes, got {len(span_id)}"
                    else:
                        reason = None
                    if reason is not None:
                        rejected += 1
                        if first_reason is None:
                            first_reason = reason
                        continue
                    n_valid += 1
                    attrs.put(125)
                    c_time.append((t or observed) or None)
                    c_obs.append(observed or None)
                    c_trace.append(trace_id.hex() if trace_id else None)
                    c_span.append(span_id.hex() if span_id else None)
                    c_sev.append(severity or None)
                    c_sevt.append(sev_text or None)
                    c_body.append(_body(body_r, bodybuf) if has_body else None)
                    c_event.append(event or None)
                    c_attrs.append(attrs.value() if n_attrs else None)
                    c_flags.append(flags)
                else:
                    _skip(&sl, wire)
            c_service.extend([service] * n_valid)
            c_res.extend([res_json] * n_valid)
            c_scope.extend([scope_name] * n_valid)
            c_scope_v.extend([scope_version] * n_valid)
    return rejected, first_reason


cdef object _body(Reader r, _Json buf):
    """A log body: strings as they are, empty as None, anything else as JSON."""
    cdef uint64_t key
    cdef Reader probe = r
    cdef Reader s
    cdef int last_field = 0
    cdef Reader last_string
    cdef int field
    while probe.pos < probe.end:
        key = _varint(&probe)
        field = <int>(key >> 3)
        if (field == 1 or field == 7) and (key & 7) == 2:
            last_string = _sub(&probe)
            last_field = field
        elif ((field == 2 or field == 3) and (key & 7) == 0) or (field == 4 and (key & 7) == 1) \
                or ((field == 5 or field == 6) and (key & 7) == 2):
            last_field = field
            _skip(&probe, <int>(key & 7))
        else:
            _skip(&probe, <int>(key & 7))
    if last_field == 0:
        return None
    if last_field == 1:
        _check_utf8(r.p + last_string.pos, last_string.end - last_string.pos)
        return PyUnicode_DecodeUTF8(<const char*>(r.p + last_string.pos),
                                    last_string.end - last_string.pos, NULL)
    if last_field == 7:  # bytes: base64 text, as the Python path gives it
        return binascii.b2a_base64(r.p[last_string.pos:last_string.end],
                                   newline=False).decode()
    buf.reset()
    _any_value(r, buf, 0)
    return buf.value()
