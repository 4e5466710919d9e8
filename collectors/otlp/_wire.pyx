# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled OTLP decoder: protobuf wire format straight into column lists.

Same output as the pure-Python path in ``decode.py`` (an equivalence test holds them to it),
without building a protobuf object tree or a dict per attribute map: attribute maps, events
and links are written as JSON text directly. Traces and logs only (the high-volume signals);
metrics keep the Python path. Raises ``WireError`` (a ValueError) for malformed input.

One known difference: a record whose attribute map repeats a key keeps both in its JSON text
(the Python path's dict keeps the last); OTLP senders do not repeat keys.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.math cimport isinf, isnan
from libc.string cimport memcmp, memcpy

from cpython.unicode cimport PyUnicode_DecodeUTF8

import binascii


class WireError(ValueError):
    pass


class NonCanonical(Exception):
    """A singular message field given twice in one message. Protobuf merges the two (a map
    or array value twice is one value with both's entries); this decoder keeps the canonical
    encoding's path fast and leaves such a body to the Python path (decode.py), which reads
    it through protobuf. Found by fuzz/fuzz_decode.py's reasoning about merges; no SDK
    writes one."""


# The bound decode.py's MAX_TIME_NS documents (2262-01-01T00:00:00Z in ns): a record with a
# time at or after it is rejected, as are all-zero ids and unknown span kinds; the checks and
# their messages are the same as decode.py's _span_ok and _log_ok.
cdef uint64_t _MAX_TIME_NS = 9214646400000000000
_TIME_RANGE = "times must be below 2262-01-01T00:00:00Z"
_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)


cdef extern from "Python.h":
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int* ptype) except NULL
    void PyMem_Free(void* p)
    int Py_DTSF_ADD_DOT_0


# The JSON buffers' first capacity. The fuzzing build (fuzz/build.py) starts them at 4 bytes,
# so that growing them (realloc, then writes past the old end) runs on nearly every input
# under AddressSanitizer: at 1024 the fuzz corpus never grew one (fuzz/coverage.py).
cdef extern from *:
    """
    #ifndef AIOPS_JSON_CAP
    #define AIOPS_JSON_CAP 1024
    #endif
    """
    const Py_ssize_t AIOPS_JSON_CAP


cdef class _Json:
    """A growable byte buffer that JSON text is written into."""
    cdef char* data
    cdef Py_ssize_t length
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.cap = AIOPS_JSON_CAP
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
            out = _as_orjson(<bytes>text)
        finally:
            PyMem_Free(text)
        self.write(out, len(out))
        return 0

    cdef str value(self):
        return PyUnicode_DecodeUTF8(self.data, self.length, NULL)


cdef bytes _as_orjson(bytes r):
    """Python's shortest repr of a double as orjson writes the same digits (the Python
    decoder's JSON): decimal for exponent -5 (6.1e-05 -> 0.000061) and exponents without zero
    padding (1e-06 -> 1e-6)."""
    cdef Py_ssize_t e = r.find(b"e")
    if e < 0:
        return r
    mantissa, exponent = r[:e], int(r[e + 1:])
    if exponent == -5:
        sign = b"-" if mantissa.startswith(b"-") else b""
        return sign + b"0.0000" + mantissa.lstrip(b"-").replace(b".", b"")
    return mantissa + (b"e+%d" % exponent if exponent > 0 else b"e%d" % exponent)


cdef class _Col:
    """One Arrow column being built: string (offsets + UTF-8 bytes) or int64, with validity."""
    cdef _Json data
    cdef _Json offsets
    cdef _Json valid
    cdef Py_ssize_t n
    cdef Py_ssize_t nulls
    cdef bint strings

    def __cinit__(self, bint strings):
        self.strings = strings
        self.data = _Json()
        self.offsets = _Json()
        self.valid = _Json()
        self.n = 0
        self.nulls = 0
        if strings:
            self._offset()

    cdef inline int _offset(self) except -1:
        cdef int32_t o = <int32_t>self.data.length
        if self.data.length > 2147483647:
            raise WireError("request too large for one batch")
        self.offsets.write(<const char*>&o, 4)
        return 0

    cdef inline int _row(self, bint ok) except -1:
        self.valid.put(1 if ok else 0)
        self.n += 1
        if not ok:
            self.nulls += 1
        return 0

    cdef int text(self, const char* p, Py_ssize_t length) except -1:
        self.data.write(p, length)
        self._offset()
        return self._row(True)

    cdef int hex(self, bytes raw) except -1:
        cdef const unsigned char* b = raw
        cdef Py_ssize_t i, k = len(raw)
        cdef const char* digits = b"0123456789abcdef"
        self.data.reserve(2 * k)
        for i in range(k):
            self.data.data[self.data.length] = digits[b[i] >> 4]
            self.data.data[self.data.length + 1] = digits[b[i] & 15]
            self.data.length += 2
        self._offset()
        return self._row(True)

    cdef int str_or_null(self, str value) except -1:
        cdef bytes encoded
        if not value:
            return self.null()
        encoded = value.encode()
        return self.text(encoded, len(encoded))

    cdef int json(self, _Json buf) except -1:
        return self.text(buf.data, buf.length)

    cdef int null(self) except -1:
        if self.strings:
            self._offset()
        else:
            self.data.write(b"\0\0\0\0\0\0\0\0", 8)
        return self._row(False)

    cdef int i64(self, int64_t v) except -1:
        self.data.write(<const char*>&v, 8)
        return self._row(True)

    cdef int fill(self, object value, Py_ssize_t times) except -1:
        """Append ``value`` (a str or None) ``times`` times: per-resource and scope values."""
        cdef bytes encoded
        cdef Py_ssize_t i
        if value is None or value == "":
            for i in range(times):
                self.null()
            return 0
        if not isinstance(value, str):
            # e.g. an int or array ``service.name``: refused as the Python path's Arrow
            # conversion refuses it, and only where a row would carry it.
            if times == 0:
                return 0
            import pyarrow as pa
            raise pa.ArrowTypeError(f"Expected bytes, got a '{type(value).__name__}' object")
        encoded = value.encode()
        for i in range(times):
            self.text(encoded, len(encoded))
        return 0

    cdef object finish(self, object arrow_type):
        import pyarrow as pa
        cdef bytearray bitmap = bytearray((self.n + 7) // 8)
        cdef Py_ssize_t i
        cdef unsigned char* bits = bitmap
        cdef const char* v = self.valid.data
        for i in range(self.n):
            if v[i]:
                bits[i >> 3] |= 1 << (i & 7)
        validity = pa.py_buffer(bitmap) if self.nulls else None
        if self.strings:
            buffers = [validity, pa.py_buffer(self.offsets.data[:self.offsets.length]),
                       pa.py_buffer(self.data.data[:self.data.length])]
        else:
            buffers = [validity, pa.py_buffer(self.data.data[:self.data.length])]
            ints = pa.Array.from_buffers(pa.int64(), self.n, buffers, null_count=self.nulls)
            return ints if arrow_type == pa.int64() else ints.cast(arrow_type)
        return pa.Array.from_buffers(arrow_type, self.n, buffers, null_count=self.nulls)


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
    # Counts the length-delimited fields skipped unread (shared by a message's sub-readers):
    # protobuf checks what such a field holds (UTF-8, a message's structure), so a body with
    # any is checked by protobuf too (decode.py), and only such bodies pay for it.
    Py_ssize_t* skipped


# -- The typed spans columns (aiops.semconv), derived while decoding --------------------------
# The rules are derive.py's (which documents them): a value only where it is certainly what
# semconv.ingest_select makes of the row's JSON; else the whole request goes without.

SPAN_KEYS = ("gen_ai.request.model", "aiops.model.version", "http.response.status_code",
             "http.status_code")  # derive.SPAN_KEYS; a test holds them equal
RESOURCE_KEYS = ("service.version", "ray.serve.replica", "ray.serve.deployment", "ray.serve.app")
_NO_RESOURCE_VALUES = (None, None, None, None)

cdef enum:
    V_NONE = 0   # absent, or null
    V_STR = 1
    V_INT = 2
    V_OTHER = 3  # bool, double, array, map, bytes


cdef struct Picked:
    int seen         # times the key came in the map
    int kind
    Py_ssize_t pos   # a string's UTF-8 bytes, [pos, end) of the body
    Py_ssize_t end
    int64_t i


cdef inline int _key_index(const unsigned char* p, Py_ssize_t n):
    """The key's place in SPAN_KEYS, or -1."""
    if n == 20 and memcmp(p, b"gen_ai.request.model", 20) == 0:
        return 0
    if n == 19 and memcmp(p, b"aiops.model.version", 19) == 0:
        return 1
    if n == 25 and memcmp(p, b"http.response.status_code", 25) == 0:
        return 2
    if n == 16 and memcmp(p, b"http.status_code", 16) == 0:
        return 3
    return -1


cdef int _pick(Reader r, Picked* out) except -1:
    """Note what an AnyValue holds: its last oneof field, as _any_value writes it."""
    cdef uint64_t key
    cdef int field, wire
    cdef Reader s
    while r.pos < r.end:
        key = _key(&r)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 1 and wire == 2:
            s = _sub(&r)
            out.kind = V_STR
            out.pos = s.pos
            out.end = s.end
        elif field == 3 and wire == 0:
            out.kind = V_INT
            out.i = <int64_t>_varint(&r)
        elif field == 8 and wire == 0:  # string_value_strindex: null (see _any_value)
            out.kind = V_NONE
            _varint(&r)
        elif (field == 2 and wire == 0) or (field == 4 and wire == 1) \
                or (5 <= field <= 7 and wire == 2):
            out.kind = V_OTHER
            _pass(&r, key, 0)  # the value's JSON is written (and checked) by _any_value
        else:
            _pass(&r, key, 0)
    return 0


cdef inline int _status(Picked* v, const unsigned char* p, int64_t* out):
    """TRY_CAST(value AS INTEGER): 1 with the value in ``out``, 0 for NULL, -1 not certain."""
    cdef Py_ssize_t j
    cdef int64_t x = 0
    cdef unsigned char c
    if v.kind == V_NONE:
        return 0
    if v.kind == V_INT:
        if -2147483648 <= v.i <= 2147483647:
            out[0] = v.i
            return 1
        return 0
    if v.kind == V_STR and 0 < v.end - v.pos <= 10:
        for j in range(v.pos, v.end):
            c = p[j]
            if c < 48 or c > 57:
                return -1
            x = x * 10 + (c - 48)
        if x <= 2147483647:
            out[0] = x
            return 1
    return -1


cdef int _derive_identity(Picked* k, const unsigned char* p, object res, _Col c_model,
                          _Col c_version, _Col c_replica, _Col c_deployment,
                          _Col c_app) except -1:
    """Append one record's identity columns (model, version, replica, deployment, app); 0,
    having appended nothing, where any is not certain (derive.py's _row)."""
    cdef bytes version, replica, deployment, app
    if k[0].seen > 1 or k[1].seen > 1 or res is None:
        return 0
    if (k[0].kind != V_NONE and k[0].kind != V_STR) or \
            (k[1].kind != V_NONE and k[1].kind != V_STR):
        return 0
    if k[0].kind == V_STR:
        c_model.text(<const char*>(p + k[0].pos), k[0].end - k[0].pos)
    else:
        c_model.null()
    version, replica, deployment, app = res
    if k[1].kind == V_STR:
        c_version.text(<const char*>(p + k[1].pos), k[1].end - k[1].pos)
    elif version is not None:
        c_version.text(version, len(version))
    else:
        c_version.null()
    _text_or_null(c_replica, replica)
    _text_or_null(c_deployment, deployment)
    _text_or_null(c_app, app)
    return 1


cdef int _derive_span(Picked* k, const unsigned char* p, uint64_t code, object res,
                      _Col c_model, _Col c_version, _Col c_replica, _Col c_http,
                      _Col c_failed, _Col c_deployment, _Col c_app) except -1:
    """Append one span's derived columns; 0 where any is not certain (derive.py's _row)."""
    cdef int found
    cdef int64_t status = 0
    if k[2].seen > 1 or k[3].seen > 1:
        return 0
    found = _status(&k[2], p, &status)
    if found == 0:  # coalesce: the older key only where the new one gave NULL
        found = _status(&k[3], p, &status)
    if found < 0:
        return 0
    if not _derive_identity(k, p, res, c_model, c_version, c_replica, c_deployment, c_app):
        return 0
    if found:
        c_http.i64(status)
    else:
        c_http.null()
    c_failed.i64(1 if code == 2 or (found and status >= 500) else 0)
    return 1


cdef inline int _text_or_null(_Col c, bytes v) except -1:
    if v is not None:
        c.text(v, len(v))
    else:
        c.null()
    return 0


cdef inline uint64_t _varint(Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if r.pos >= r.end:
            raise WireError("truncated varint")
        b = r.p[r.pos]
        r.pos += 1
        # Bits past 64 in a tenth byte are dropped, as protobuf (upb) drops them.
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            return result
        shift += 7
        if shift >= 70:
            raise WireError("varint too long")


cdef inline uint64_t _tag(Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    """A field's key (number << 3 | wire type), refused where protobuf refuses any tag: past
    32 bits, or longer than 5 bytes (overlong or not, as upb reads it)."""
    cdef Py_ssize_t start = r.pos
    cdef uint64_t key = _varint(r)
    if r.pos - start > 5:
        raise WireError("field key too long")
    if key > 0xFFFFFFFF:
        raise WireError("field key out of range")
    return key


cdef inline uint64_t _key(Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    """A message field's key; field number 0 is refused too (found by fuzz/fuzz_decode.py:
    the Python path said "wire format was corrupt" where this decoder skipped the field).
    Inside a skipped group protobuf allows it (``_pass`` reads those with ``_tag``)."""
    cdef uint64_t key = _tag(r)
    if key >> 3 == 0:
        raise WireError("field number 0")
    return key


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
    out.skipped = r.skipped
    out.pos = r.pos
    out.end = r.pos + <Py_ssize_t>n
    r.pos = out.end
    return out


cdef int _skip(Reader* r, uint64_t key) except -1:
    """Past the value of a field this decoder does not read (``_pass``), counted in
    ``r.skipped`` where it is length-delimited (protobuf may refuse what it holds)."""
    if (key & 7) == 2 and r.skipped != NULL:
        r.skipped[0] += 1
    return _pass(r, key, 0)


cdef int _pass(Reader* r, uint64_t key, int depth) except -1:
    """Past the value of an unknown field whose ``key`` was just read. A group (wire type 3,
    proto2) is skipped to its matching end, as protobuf skips it (found by fuzz/fuzz_decode.py:
    this decoder refused one the Python path read past); an end without its start is corrupt."""
    cdef int wire = <int>(key & 7)
    cdef uint64_t inner
    if wire == 0:
        _varint(r)
    elif wire == 1:
        _fixed64(r)
    elif wire == 2:
        _sub(r)
    elif wire == 5:
        _fixed32(r)
    elif wire == 3:
        if depth >= 64:
            raise WireError("groups nested too deeply")
        while True:
            if r.pos >= r.end:
                raise WireError("group not closed")
            inner = _tag(r)
            if <int>(inner & 7) == 4:
                if inner >> 3 != key >> 3:
                    raise WireError("group closed by another field's end")
                return 0
            _pass(r, inner, depth + 1)
    else:
        raise WireError(f"unsupported wire type {wire}")
    return 0


cdef inline int _schema_url(Reader* r) except -1:
    """A schema_url (not stored): a string, so checked as protobuf checks it. Read here
    rather than skipped, since SDK instrumentations set one on most exports."""
    cdef Reader s = _sub(r)
    return _check_utf8(r.p + s.pos, s.end - s.pos)


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
    cdef int current = 0
    if depth > 64:
        raise WireError("values nested too deeply")
    while r.pos < r.end:
        key = _key(&r)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if not ((field == 1 and wire == 2) or (field == 2 and wire == 0)
                or (field == 3 and wire == 0) or (field == 4 and wire == 1)
                or (5 <= field <= 7 and wire == 2) or (field == 8 and wire == 0)):
            _skip(&r, key)
            continue
        # A oneof: if a sender repeats it, the last one wins, as in protobuf, except a
        # message member given twice in a row, which protobuf merges.
        if (field == 5 or field == 6) and current == field:
            raise NonCanonical("an array or map value given twice")
        current = field
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
        elif field == 8:
            # string_value_strindex: an index into a profiles dictionary, which no trace or
            # log request carries; a member of the oneof all the same (it replaces what came
            # before it), written as null, as decode.any_value gives it (found by
            # fuzz/fuzz_decode.py: this decoder skipped it and kept the earlier value).
            _varint(&r)
            out.write(b"null", 4)
        elif field == 5:  # ArrayValue { repeated AnyValue values = 1 }
            s = _sub(&r)
            out.put(91)
            first = True
            while s.pos < s.end:
                key = _key(&s)
                if (key >> 3) == 1 and (key & 7) == 2:
                    if not first:
                        out.put(44)
                    first = False
                    _any_value(_sub(&s), out, depth + 1)
                else:
                    _skip(&s, key)
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
        key = _key(&r)
        if <int>(key >> 3) == field_no and (key & 7) == 2:
            if not first:
                out.put(44)
            first = False
            _one_kv(_sub(&r), out, depth)
        else:
            _skip(&r, key)
    out.put(125)
    return 0


cdef tuple _resource(Reader r, int field_no):
    """(service.name, attributes JSON or None, what the derived columns read of it) of a
    Resource message: the last is RESOURCE_KEYS' values as UTF-8 bytes or
    None, or None where one of them is neither a string nor null (derive.py's rule)."""
    cdef _Json out = _Json()
    cdef str json_text
    _kv_object(r, out, field_no, 0)
    json_text = out.value()
    if json_text == "{}":
        return None, None, _NO_RESOURCE_VALUES
    import orjson
    attrs = orjson.loads(json_text)
    service = attrs.get("service.name")
    derived = []
    for k in RESOURCE_KEYS:
        v = attrs.get(k)
        if v is not None and not isinstance(v, str):
            derived = None
            break
        derived.append(None if v is None else (<str>v).encode())
    # Re-serialised so duplicate keys collapse exactly as the Python path's dict does.
    return service, orjson.dumps(attrs).decode(), \
        None if derived is None else tuple(derived)


cdef tuple _scope(Reader r):
    cdef uint64_t key
    name = None
    version = None
    while r.pos < r.end:
        key = _key(&r)
        if (key >> 3) == 1 and (key & 7) == 2:
            name = _str(&r) or None
        elif (key >> 3) == 2 and (key & 7) == 2:
            version = _str(&r) or None
        else:
            _skip(&r, key)
    return name, version


_SPAN_STRINGS = ("trace_id", "span_id", "parent_span_id", "trace_state", "name", "kind",
                 "status_code", "status_message", "service_name", "resource_attributes",
                 "scope_name", "scope_version", "attributes", "events", "links")
_SPAN_INTS = ("start_time", "end_time", "duration_ns", "dropped_attributes_count")
_LOG_STRINGS = ("trace_id", "span_id", "severity_text", "body", "event_name", "service_name",
                "resource_attributes", "scope_name", "scope_version", "attributes")
_LOG_INTS = ("time", "observed_time", "severity_number", "flags")


cdef dict _columns(tuple strings, tuple ints):
    cols = {name: _Col(True) for name in strings}
    cols.update({name: _Col(False) for name in ints})
    return cols


cdef dict _finish(dict cols, object schema):
    return {f.name: (<_Col>cols[f.name]).finish(f.type) for f in schema}


def decode_spans(const unsigned char[:] body, object schema, object derived_schema=None):
    """Arrow arrays of the spans table (by ``schema``) from an ExportTraceServiceRequest.
    Returns (arrays by column name, rejected count, first rejection reason, count of
    length-delimited fields skipped unread). With
    ``derived_schema`` (derive.DERIVED_SCHEMA), the arrays hold its derived columns too where
    every span's are certain."""
    cdef Reader top, rs, ss, sp, s
    cdef Picked picked[4]
    cdef Picked* picking
    cdef bint derive = derived_schema is not None
    cdef int i
    cdef dict dcols = _columns(("model", "model_version", "replica", "deployment", "app"),
                               ("http_status", "failed"))
    cdef _Col c_model = dcols["model"], c_version = dcols["model_version"]
    cdef _Col c_replica = dcols["replica"], c_http = dcols["http_status"]
    cdef _Col c_failed = dcols["failed"], c_deployment = dcols["deployment"]
    cdef _Col c_app = dcols["app"]
    cdef uint64_t key, start, end, kind, code, dropped, latest_event
    cdef int32_t kind32
    cdef int field, wire, n_valid
    cdef _Json attrs = _Json()
    cdef _Json events = _Json()
    cdef _Json links = _Json()
    cdef int rejected = 0
    cdef Py_ssize_t skipped = 0
    cdef bint n_attrs, n_events, n_links
    cdef bytes kind_text, code_text
    cdef dict cols = _columns(_SPAN_STRINGS, _SPAN_INTS)
    cdef _Col c_trace = cols["trace_id"], c_span = cols["span_id"]
    cdef _Col c_parent = cols["parent_span_id"], c_state = cols["trace_state"]
    cdef _Col c_name = cols["name"], c_kind = cols["kind"], c_start = cols["start_time"]
    cdef _Col c_end = cols["end_time"], c_dur = cols["duration_ns"]
    cdef _Col c_code = cols["status_code"], c_msg = cols["status_message"]
    cdef _Col c_attrs = cols["attributes"], c_events = cols["events"], c_links = cols["links"]
    cdef _Col c_dropped = cols["dropped_attributes_count"]
    cdef _Col c_service = cols["service_name"], c_res = cols["resource_attributes"]
    cdef _Col c_scope = cols["scope_name"], c_scope_v = cols["scope_version"]
    first_reason = None
    top.p = &body[0] if body.shape[0] else NULL
    top.skipped = &skipped
    top.pos = 0
    top.end = body.shape[0]
    while top.pos < top.end:
        key = _key(&top)
        if (key >> 3) != 1 or (key & 7) != 2:
            _skip(&top, key)
            continue
        rs = _sub(&top)
        service, res_json, res_derived = None, None, _NO_RESOURCE_VALUES
        scopes = []
        while rs.pos < rs.end:
            key = _key(&rs)
            if (key >> 3) == 1 and (key & 7) == 2:
                if res_json is not None:
                    raise NonCanonical("a resource given twice")
                service, res_json, res_derived = _resource(_sub(&rs), 1)
            elif (key >> 3) == 2 and (key & 7) == 2:
                s = _sub(&rs)
                scopes.append((s.pos, s.end))
            elif (key >> 3) == 3 and (key & 7) == 2:
                _schema_url(&rs)
            else:
                _skip(&rs, key)
        for scope_start, scope_end in scopes:
            ss.p = top.p
            ss.skipped = top.skipped
            ss.pos = scope_start
            ss.end = scope_end
            scope_name, scope_version, scope_seen = None, None, False
            n_valid = 0
            while ss.pos < ss.end:
                key = _key(&ss)
                field = <int>(key >> 3)
                wire = <int>(key & 7)
                if field == 1 and wire == 2:
                    if scope_seen:
                        raise NonCanonical("a scope given twice")
                    scope_seen = True
                    scope_name, scope_version = _scope(_sub(&ss))
                elif field == 2 and wire == 2:
                    sp = _sub(&ss)
                    trace_id = b""
                    span_id = b""
                    parent = b""
                    state = ""
                    name = ""
                    message = ""
                    kind = start = end = dropped = code = latest_event = 0
                    attrs.reset(); events.reset(); links.reset()
                    n_attrs = n_events = n_links = False
                    attrs.put(123); events.put(91); links.put(91)
                    picking = picked if derive else NULL
                    for i in range(4):
                        picked[i].seen = 0
                        picked[i].kind = V_NONE
                    while sp.pos < sp.end:
                        key = _key(&sp)
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
                            _one_kv(_sub(&sp), attrs, 0, picking)
                        elif field == 10 and wire == 0:
                            dropped = _varint(&sp) & 0xFFFFFFFF  # a uint32
                        elif field == 11 and wire == 2:
                            if n_events:
                                events.put(44)
                            n_events = True
                            _event(_sub(&sp), events, &latest_event)
                        elif field == 13 and wire == 2:
                            if n_links:
                                links.put(44)
                            n_links = True
                            _link(_sub(&sp), links)
                        elif field == 15 and wire == 2:
                            s = _sub(&sp)
                            while s.pos < s.end:
                                key = _key(&s)
                                if (key >> 3) == 2 and (key & 7) == 2:
                                    message = _str(&s)
                                elif (key >> 3) == 3 and (key & 7) == 0:
                                    # An enum: protobuf keeps the low 32 bits.
                                    code = _varint(&s) & 0xFFFFFFFF
                                else:
                                    _skip(&s, key)
                        else:
                            _skip(&sp, key)
                    # An enum is an int32: protobuf keeps the low 32 bits of the varint, signed.
                    kind32 = <int32_t>(<uint32_t>(kind & 0xFFFFFFFF))
                    if len(trace_id) != 16:
                        reason = f"trace_id must be 16 bytes, got {len(trace_id)}"
                    elif len(span_id) != 8:
                        reason = f"span_id must be 8 bytes, got {len(span_id)}"
                    elif parent and len(parent) != 8:
                        reason = f"parent_span_id must be 8 bytes, got {len(parent)}"
                    elif trace_id == _ZERO_TRACE:
                        reason = f"span {span_id.hex()} has an all-zero trace_id (invalid in OTLP)"
                    elif span_id == _ZERO_SPAN:
                        reason = "span_id is all zeros (invalid in OTLP)"
                    elif not start:
                        reason = f"span {span_id.hex()} has no start time"
                    elif start >= _MAX_TIME_NS:
                        reason = (f"span {span_id.hex()} start_time_unix_nano {start} is out of "
                                  f"range ({_TIME_RANGE})")
                    elif end >= _MAX_TIME_NS:
                        reason = (f"span {span_id.hex()} end_time_unix_nano {end} is out of "
                                  f"range ({_TIME_RANGE})")
                    elif end and end < start:
                        reason = (f"span {span_id.hex()} ends before it starts "
                                  f"(end_time_unix_nano {end} < start_time_unix_nano {start})")
                    elif not 0 <= kind32 < 6:
                        reason = (f"span {span_id.hex()} has unknown kind {kind32} "
                                  f"(SpanKind is 0-5)")
                    elif latest_event >= _MAX_TIME_NS:
                        reason = f"span {span_id.hex()} has an event time out of range ({_TIME_RANGE})"
                    else:
                        reason = None
                    if reason is not None:
                        rejected += 1
                        if first_reason is None:
                            first_reason = reason
                        continue
                    n_valid += 1
                    attrs.put(125); events.put(93); links.put(93)
                    c_trace.hex(trace_id)
                    c_span.hex(span_id)
                    if parent:
                        c_parent.hex(parent)
                    else:
                        c_parent.null()
                    c_state.str_or_null(state)
                    c_name.fill(name, 1) if name else c_name.text(b"", 0)
                    if kind32:  # 1-5 here: 0 is unspecified, the rest were rejected
                        kind_text = _KIND_BYTES[kind32]
                        c_kind.text(kind_text, len(kind_text))
                    else:
                        c_kind.null()
                    c_start.i64(<int64_t>start)
                    if end:
                        c_end.i64(<int64_t>end)
                        c_dur.i64(<int64_t>(end - start))
                    else:
                        c_end.null()
                        c_dur.null()
                    if code < 3:
                        code_text = _STATUS_BYTES[code]
                        c_code.text(code_text, len(code_text))
                    else:
                        c_code.null()
                    c_msg.str_or_null(message)
                    c_attrs.json(attrs) if n_attrs else c_attrs.null()
                    c_events.json(events) if n_events else c_events.null()
                    c_links.json(links) if n_links else c_links.null()
                    c_dropped.i64(<int64_t>dropped)
                    if derive:
                        derive = _derive_span(picked, top.p, code, res_derived, c_model,
                                              c_version, c_replica, c_http, c_failed,
                                              c_deployment, c_app)
                elif field == 3 and wire == 2:
                    _schema_url(&ss)
                else:
                    _skip(&ss, key)
            c_service.fill(service, n_valid)
            c_res.fill(res_json, n_valid)
            c_scope.fill(scope_name, n_valid)
            c_scope_v.fill(scope_version, n_valid)
    arrays = _finish(cols, schema)
    if derive:
        arrays.update({f.name: (<_Col>dcols[f.name]).finish(f.type) for f in derived_schema
                       if f.name in dcols})
    return arrays, rejected, first_reason, skipped


_KIND_BYTES = (b"", b"internal", b"server", b"client", b"producer", b"consumer")
_STATUS_BYTES = (b"unset", b"ok", b"error")


cdef int _one_kv(Reader kv, _Json out, int depth=0, Picked* picked=NULL) except -1:
    """Write one KeyValue as ``"key":value``; with ``picked``, note the value of a key the
    derived columns read."""
    cdef uint64_t key
    cdef Reader s, value
    cdef bint has_value = False
    cdef Py_ssize_t kstart = -1, kend = -1
    cdef int which
    while kv.pos < kv.end:
        key = _key(&kv)
        if (key >> 3) == 1 and (key & 7) == 2:
            s = _sub(&kv)
            # Every occurrence is checked, as protobuf checks it, not only the last, which
            # is kept (found by fuzz/fuzz_decode.py: a replaced key that was not UTF-8).
            _check_utf8(kv.p + s.pos, s.end - s.pos)
            kstart = s.pos
            kend = s.end
        elif (key >> 3) == 2 and (key & 7) == 2:
            if has_value:
                raise NonCanonical("a key's value given twice")
            value = _sub(&kv)
            has_value = True
        else:
            _skip(&kv, key)
    if kstart < 0:
        out.write(b'""', 2)
    else:
        out.string(kv.p + kstart, kend - kstart)
    out.put(58)
    if has_value:
        _any_value(value, out, depth)
    else:
        out.write(b"null", 4)
    if picked != NULL and kstart >= 0:
        which = _key_index(kv.p + kstart, kend - kstart)
        if which >= 0:
            picked[which].seen += 1
            picked[which].kind = V_NONE
            if has_value:
                _pick(value, &picked[which])
    return 0


cdef int _event(Reader r, _Json out, uint64_t* latest) except -1:
    """Write one span event as JSON; raise ``latest[0]`` to its time if later."""
    cdef uint64_t key, t = 0
    cdef _Json attrs = _Json()
    cdef bint n_attrs = False
    name = ""
    attrs.put(123)
    while r.pos < r.end:
        key = _key(&r)
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
            _skip(&r, key)
    attrs.put(125)
    if t > latest[0]:
        latest[0] = t
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
        key = _key(&r)
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
            _skip(&r, key)
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


def decode_logs(const unsigned char[:] body, object schema, object derived_schema=None):
    """Arrow arrays of the logs table (by ``schema``) from an ExportLogsServiceRequest.
    Returns (arrays by column name, rejected count, first rejection reason, count of
    length-delimited fields skipped unread). With ``derived_schema``
    (derive.LOG_DERIVED_SCHEMA), the arrays hold its derived columns too where every
    record's are certain."""
    cdef Reader top, rl, sl, lr, s
    cdef Picked picked[4]
    cdef Picked* picking
    cdef bint derive = derived_schema is not None
    cdef int i
    cdef dict dcols = _columns(("model", "model_version", "replica", "deployment", "app"), ())
    cdef _Col d_model = dcols["model"], d_version = dcols["model_version"]
    cdef _Col d_replica = dcols["replica"], d_deployment = dcols["deployment"]
    cdef _Col d_app = dcols["app"]
    cdef uint64_t key, t, observed, severity, flags
    cdef int field, wire, n_valid, rejected = 0
    cdef Py_ssize_t skipped = 0
    cdef _Json attrs = _Json()
    cdef _Json bodybuf = _Json()
    cdef bint n_attrs, has_body
    cdef Reader body_r
    cdef dict cols = _columns(_LOG_STRINGS, _LOG_INTS)
    cdef _Col c_time = cols["time"], c_obs = cols["observed_time"]
    cdef _Col c_trace = cols["trace_id"], c_span = cols["span_id"]
    cdef _Col c_sev = cols["severity_number"], c_sevt = cols["severity_text"]
    cdef _Col c_body = cols["body"], c_event = cols["event_name"]
    cdef _Col c_attrs = cols["attributes"], c_flags = cols["flags"]
    cdef _Col c_service = cols["service_name"], c_res = cols["resource_attributes"]
    cdef _Col c_scope = cols["scope_name"], c_scope_v = cols["scope_version"]
    first_reason = None
    top.p = &body[0] if body.shape[0] else NULL
    top.skipped = &skipped
    top.pos = 0
    top.end = body.shape[0]
    while top.pos < top.end:
        key = _key(&top)
        if (key >> 3) != 1 or (key & 7) != 2:
            _skip(&top, key)
            continue
        rl = _sub(&top)
        service, res_json, res_derived = None, None, _NO_RESOURCE_VALUES
        scopes = []
        while rl.pos < rl.end:
            key = _key(&rl)
            if (key >> 3) == 1 and (key & 7) == 2:
                if res_json is not None:
                    raise NonCanonical("a resource given twice")
                service, res_json, res_derived = _resource(_sub(&rl), 1)
            elif (key >> 3) == 2 and (key & 7) == 2:
                s = _sub(&rl)
                scopes.append((s.pos, s.end))
            elif (key >> 3) == 3 and (key & 7) == 2:
                _schema_url(&rl)
            else:
                _skip(&rl, key)
        for scope_start, scope_end in scopes:
            sl.p = top.p
            sl.skipped = top.skipped
            sl.pos = scope_start
            sl.end = scope_end
            scope_name, scope_version, scope_seen = None, None, False
            n_valid = 0
            while sl.pos < sl.end:
                key = _key(&sl)
                field = <int>(key >> 3)
                wire = <int>(key & 7)
                if field == 1 and wire == 2:
                    if scope_seen:
                        raise NonCanonical("a scope given twice")
                    scope_seen = True
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
                    picking = picked if derive else NULL
                    for i in range(4):
                        picked[i].seen = 0
                        picked[i].kind = V_NONE
                    while lr.pos < lr.end:
                        key = _key(&lr)
                        field = <int>(key >> 3)
                        wire = <int>(key & 7)
                        if field == 1 and wire == 1:
                            t = _fixed64(&lr)
                        elif field == 11 and wire == 1:
                            observed = _fixed64(&lr)
                        elif field == 2 and wire == 0:
                            severity = _varint(&lr) & 0xFFFFFFFF  # an enum (int32)
                        elif field == 3 and wire == 2:
                            sev_text = _str(&lr)
                        elif field == 5 and wire == 2:
                            if has_body:
                                raise NonCanonical("a log body given twice")
                            body_r = _sub(&lr)
                            has_body = True
                        elif field == 6 and wire == 2:
                            if n_attrs:
                                attrs.put(44)
                            n_attrs = True
                            _one_kv(_sub(&lr), attrs, 0, picking)
                        elif field == 8 and wire == 5:
                            flags = _fixed32(&lr)
                        elif field == 9 and wire == 2:
                            trace_id = _bytes(&lr)
                        elif field == 10 and wire == 2:
                            span_id = _bytes(&lr)
                        elif field == 12 and wire == 2:
                            event = _str(&lr)
                        else:
                            _skip(&lr, key)
                    if trace_id and len(trace_id) != 16:
                        reason = f"trace_id must be 16 bytes, got {len(trace_id)}"
                    elif span_id and len(span_id) != 8:
                        reason = f"span_id must be 8 bytes, got {len(span_id)}"
                    elif t >= _MAX_TIME_NS:
                        reason = (f"log record time_unix_nano {t} is out of range "
                                  f"({_TIME_RANGE})")
                    elif observed >= _MAX_TIME_NS:
                        reason = (f"log record observed_time_unix_nano {observed} is out of "
                                  f"range ({_TIME_RANGE})")
                    else:
                        reason = None
                    if reason is not None:
                        rejected += 1
                        if first_reason is None:
                            first_reason = reason
                        continue
                    n_valid += 1
                    attrs.put(125)
                    if t or observed:
                        c_time.i64(<int64_t>(t or observed))
                    else:
                        c_time.null()
                    c_obs.i64(<int64_t>observed) if observed else c_obs.null()
                    c_trace.hex(trace_id) if trace_id else c_trace.null()
                    c_span.hex(span_id) if span_id else c_span.null()
                    c_sev.i64(<int64_t>(<int32_t>(<uint32_t>severity))) if severity \
                        else c_sev.null()
                    c_sevt.str_or_null(sev_text)
                    if has_body:
                        value = _body(body_r, bodybuf)
                        if value is None:
                            c_body.null()
                        else:
                            encoded = (<str>value).encode()
                            c_body.text(encoded, len(encoded))
                    else:
                        c_body.null()
                    c_event.str_or_null(event)
                    c_attrs.json(attrs) if n_attrs else c_attrs.null()
                    c_flags.i64(<int64_t>flags)
                    if derive:
                        derive = _derive_identity(picked, top.p, res_derived, d_model,
                                                  d_version, d_replica, d_deployment, d_app)
                elif field == 3 and wire == 2:
                    _schema_url(&sl)
                else:
                    _skip(&sl, key)
            c_service.fill(service, n_valid)
            c_res.fill(res_json, n_valid)
            c_scope.fill(scope_name, n_valid)
            c_scope_v.fill(scope_version, n_valid)
    arrays = _finish(cols, schema)
    if derive:
        arrays.update({f.name: (<_Col>dcols[f.name]).finish(f.type) for f in derived_schema
                       if f.name in dcols})
    return arrays, rejected, first_reason, skipped


cdef object _body(Reader r, _Json buf):
    """A log body: strings as they are, empty as None, anything else as JSON."""
    cdef uint64_t key
    cdef Reader probe = r
    cdef Reader s
    cdef int last_field = 0
    cdef Reader last_string
    cdef int field
    cdef bint structured = False
    while probe.pos < probe.end:
        key = _key(&probe)
        field = <int>(key >> 3)
        if (field == 1 or field == 7) and (key & 7) == 2:
            last_string = _sub(&probe)
            last_field = field
            if field == 1:  # protobuf checks every string of a oneof, not only the last
                _check_utf8(r.p + last_string.pos, last_string.end - last_string.pos)
        elif (field == 5 or field == 6) and (key & 7) == 2:
            if last_field == field:
                raise NonCanonical("an array or map body given twice")
            last_field = field
            structured = True
            _pass(&probe, key, 0)
        elif ((field == 2 or field == 3 or field == 8) and (key & 7) == 0) \
                or (field == 4 and (key & 7) == 1):
            last_field = field
            _pass(&probe, key, 0)
        else:
            _skip(&probe, key)
    if structured and last_field != 5 and last_field != 6 and r.skipped != NULL:
        r.skipped[0] += 1  # an array or map a later value replaced: never parsed here
    if last_field == 0 or last_field == 8:  # 8: string_value_strindex, null (_any_value)
        return None
    if last_field == 1:
        return PyUnicode_DecodeUTF8(<const char*>(r.p + last_string.pos),
                                    last_string.end - last_string.pos, NULL)
    if last_field == 7:  # bytes: base64 text, as the Python path gives it
        return binascii.b2a_base64(r.p[last_string.pos:last_string.end],
                                   newline=False).decode()
    buf.reset()
    _any_value(r, buf, 0)
    return buf.value()


# -- Prometheus remote write: the size of a WriteRequest, before it is parsed -----------------

def count_write_request(const unsigned char[:] body, Py_ssize_t limit):
    """(series, samples) of a remote write 1.0 ``WriteRequest`` (timeseries = 1, and in each
    its samples = 2), read from the wire without building a message; the count stops as soon
    as either passes ``limit``, so a body of millions of empty samples costs a few hundred
    thousand steps, not a parse. Fields of other numbers or wire types are passed as protobuf
    passes unknown fields; a body protobuf would refuse as truncated raises ``WireError``."""
    cdef Reader top, ts
    cdef uint64_t key
    cdef Py_ssize_t series = 0, samples = 0
    top.p = &body[0] if body.shape[0] else NULL
    top.skipped = NULL
    top.pos = 0
    top.end = body.shape[0]
    while top.pos < top.end:
        key = _key(&top)
        if key != ((1 << 3) | 2):
            _pass(&top, key, 0)
            continue
        series += 1
        if series > limit:
            break
        ts = _sub(&top)
        while ts.pos < ts.end:
            key = _key(&ts)
            if key == ((2 << 3) | 2):
                samples += 1
                if samples > limit:
                    return series, samples
            _pass(&ts, key, 0)
    return series, samples
