"""TensorBoard event files, written with the standard library alone (no TensorFlow, no
tensorboard, no protobuf).

An event file is a sequence of TFRecords, each ``length (uint64) | masked CRC32C of the length
(uint32) | data | masked CRC32C of the data (uint32)``, all little-endian. Each record's data
is one ``Event`` protobuf message (tensorflow/core/util/event.proto): the first holds the file
version, every later one a step's ``Summary`` of scalar values. Only the few protobuf fields
those need are encoded here:

    Event:         wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
                   summary = 5 (Summary)
    Summary:       value = 1 (repeated Value)
    Summary.Value: tag = 1 (string), simple_value = 2 (float)

TensorBoard finds the files by name (``events.out.tfevents.*``) in the directory it is given.
"""
import os
import socket
import struct
import time

PREFIX = "events.out.tfevents."
FILE_VERSION = b"brain.Event:2"


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    """TFRecord's checksum: the CRC rotated right by 15 bits, plus a constant (so that a CRC
    stored inside checksummed data does not checksum to itself)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data):
    """One TFRecord around ``data``."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data
            + struct.pack("<I", masked_crc32c(data)))


# ---- protobuf's wire format, for the fields above ------------------------------------------

def _varint(value):
    out = bytearray()
    value &= (1 << 64) - 1  # a negative int64 is its two's complement, ten bytes long
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field, wire_type):
    return _varint(field << 3 | wire_type)


def _bytes_field(field, data):
    return _key(field, 2) + _varint(len(data)) + data


def event(wall_time, step=None, file_version=None, scalars=None):
    """An Event message: at ``wall_time`` (seconds since the epoch), the file's version or
    a summary of ``scalars`` ({tag: number}) at ``step``."""
    out = _key(1, 1) + struct.pack("<d", wall_time)
    if step is not None:
        out += _key(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _bytes_field(3, file_version)
    if scalars:
        summary = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode("utf-8"))
                         + _key(2, 5) + struct.pack("<f", float(value)))
            for tag, value in scalars.items())
        out += _bytes_field(5, summary)
    return out


class EventWriter:
    """Appends scalars to a new event file in ``directory``; every call writes through."""

    def __init__(self, directory):
        name = f"{PREFIX}{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(directory, name)
        self.file = open(self.path, "ab")
        self._write(event(time.time(), file_version=FILE_VERSION))

    def _write(self, message):
        self.file.write(record(message))
        self.file.flush()

    def scalars(self, step, values):
        """``values`` ({tag: number}) at ``step``; None values are left out."""
        values = {tag: value for tag, value in values.items() if value is not None}
        if values:
            self._write(event(time.time(), step=step, scalars=values))

    def close(self):
        self.file.close()


def event_files(directory):
    """The names of the event files in a directory."""
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith(PREFIX))
    except OSError:
        return []
