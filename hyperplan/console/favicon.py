"""The site's icon, /favicon.ico: drawn here, as a 32 x 32 PNG inside an ICO file.

Browsers ask for /favicon.ico on any page of a site (the console's pages also link it), without
credentials; answered by anything else it would be a failed request on every page. The picture is the
console's own: three booking bars, like a pool's timeline, on the header's dark ground. It is made from
this description with the standard library (zlib, struct) once, at the first request.
"""

from __future__ import annotations

import struct
import zlib
from functools import cache

from starlette.requests import Request
from starlette.responses import Response

SIZE = 32
Colour = tuple[int, int, int, int]
GROUND: Colour = (0x1D, 0x24, 0x30, 0xFF)  # the header's ink
CLEAR: Colour = (0, 0, 0, 0)
# (first row, last row, first column, last column, colour): the bars, each a reservation on a timeline
BARS = (
    (7, 11, 5, 20, (0x5B, 0x9C, 0xF5, 0xFF)),
    (14, 18, 11, 27, (0x4F, 0xBF, 0x7F, 0xFF)),
    (21, 25, 5, 15, (0xE0, 0x86, 0x1C, 0xFF)),
)
CORNER = 5  # the ground's rounded corners, in pixels


def pixel(row: int, column: int) -> Colour:
    for top, bottom, left, right, colour in BARS:
        if top <= row <= bottom and left <= column <= right:
            return colour
    return GROUND if _inside_rounded_square(row, column) else CLEAR


def _inside_rounded_square(row: int, column: int) -> bool:
    # The distance from the nearest corner's centre, for pixels in a corner's square only.
    near_row = min(max(row, CORNER), SIZE - 1 - CORNER)
    near_column = min(max(column, CORNER), SIZE - 1 - CORNER)
    return (row - near_row) ** 2 + (column - near_column) ** 2 <= CORNER**2


def png() -> bytes:
    rows = b"".join(
        b"\x00" + b"".join(bytes(pixel(row, column)) for column in range(SIZE)) for row in range(SIZE)
    )  # each row behind filter type 0 (none)
    header = struct.pack(">IIBBBBB", SIZE, SIZE, 8, 6, 0, 0, 0)  # 8 bits a channel, RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows, 9))
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@cache
def ico() -> bytes:
    """An ICO file of one image, the PNG (which every browser reads inside an ICO)."""
    image = png()
    directory = struct.pack("<HHH", 0, 1, 1)  # reserved, type 1 (icon), one image
    entry = struct.pack("<BBBBHHII", SIZE, SIZE, 0, 0, 1, 32, len(image), 6 + 16)
    return directory + entry + image


async def favicon(request: Request) -> Response:
    return Response(ico(), media_type="image/x-icon", headers={"Cache-Control": "public, max-age=86400"})
