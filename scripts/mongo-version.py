#!/usr/bin/env python3
"""Prints the version a MongoDB-wire server reports (buildInfo), with no driver installed.

Used by `scripts/services status`; sends one OP_MSG and reads one reply.
"""
import socket
import struct
import sys


def bson_doc(pairs):
    body = b""
    for key, value in pairs:
        k = key.encode() + b"\0"
        if isinstance(value, int):
            body += b"\x10" + k + struct.pack("<i", value)
        else:
            v = value.encode() + b"\0"
            body += b"\x02" + k + struct.pack("<i", len(v)) + v
    return struct.pack("<i", len(body) + 5) + body + b"\0"


def find_string(doc, key):
    i = 4
    while i < len(doc) - 1:
        kind = doc[i]
        end = doc.index(b"\0", i + 1)
        name = doc[i + 1:end].decode()
        i = end + 1
        if kind == 0x02:
            n = struct.unpack_from("<i", doc, i)[0]
            if name == key:
                return doc[i + 4:i + 3 + n].decode()
            i += 4 + n
        elif kind in (0x01, 0x09, 0x11, 0x12):
            i += 8
        elif kind == 0x10:
            i += 4
        elif kind == 0x08:
            i += 1
        elif kind == 0x0A:
            pass
        elif kind in (0x03, 0x04):
            i += struct.unpack_from("<i", doc, i)[0]
        else:
            return None
    return None


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 27017
    doc = bson_doc([("buildInfo", 1), ("$db", "admin")])
    msg = struct.pack("<I", 0) + b"\0" + doc
    header = struct.pack("<iiii", 16 + len(msg), 1, 0, 2013)
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(header + msg)
        raw = s.recv(4)
        length = struct.unpack("<i", raw)[0]
        while len(raw) < length:
            raw += s.recv(length - len(raw))
    reply = raw[21:]
    version = find_string(reply, "version")
    print(f"mongodb-wire {version}" if version else "mongodb-wire server")


if __name__ == "__main__":
    main()
