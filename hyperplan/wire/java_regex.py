"""Java regular expressions, as botocore's models write their patterns, translated for Python's ``re``.

The SageMaker model's patterns are written for ``java.util.regex``. :func:`compiled_pattern` translates
the few Java-only constructs it uses (``\\p{L}``-style classes, surrogate-pair escapes, a quantified
``$``) into Python ``re`` syntax. A pattern that still cannot be compiled is not enforced (logged once
and listed in :data:`UNENFORCED_PATTERNS`) rather than failing every request that uses it.
"""

from __future__ import annotations

import logging
import re
import sys
import unicodedata
from functools import cache, lru_cache

log = logging.getLogger(__name__)

# Patterns Python cannot compile even after translation: pattern -> reason. Filled lazily.
UNENFORCED_PATTERNS: dict[str, str] = {}


class PatternTranslationError(ValueError):
    """A Java regex construct with no faithful Python translation."""


@cache
def compiled_pattern(pattern: str) -> re.Pattern[str] | None:
    """The model pattern compiled for Python's ``re``, or None when it cannot be enforced.

    ``re.ASCII`` mirrors Java's defaults, where ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII-only.
    """
    try:
        return re.compile(java_to_python(pattern), re.ASCII)
    except (PatternTranslationError, re.error) as exc:
        UNENFORCED_PATTERNS[pattern] = str(exc)
        log.warning("model pattern %r is not enforced: %s", pattern, exc)
        return None


# Java's "." excludes every line terminator, Python's only "\n".
_JAVA_DOT = r"[^\n\r\u0085\u2028\u2029]"
_QUANTIFIER = re.compile(r"(?:[*+?]|\{\d+(?:,\d*)?\})[?+]?")
# Java escapes with no Python equivalent that we know how to write.
_UNSUPPORTED_ESCAPES = set("QEGRXhHkKcVv")


def java_to_python(pattern: str) -> str:
    """Translate the Java-only constructs of a ``java.util.regex`` pattern into Python ``re`` syntax.

    Handled: ``\\p{..}``/``\\P{..}`` classes (Unicode general categories and POSIX names), ``\\uD83D\\uDE00``
    surrogate pairs, ``\\x{h..h}``, ``\\e``, ``\\z``, ``(?<name>``, Java's line-terminator-aware ``.``, and
    quantifiers on ``^``/``$`` (legal in Java, meaningless: ``${1,128}`` is just ``$``). Anything else that
    is Java-only (nested classes, ``&&`` intersections, ``\\Q..\\E``, ...) raises PatternTranslationError.
    """
    out: list[str] = []
    i, in_class, class_start = 0, False, -1
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            text, i = _translate_escape(pattern, i, in_class)
            out.append(text)
            continue
        if in_class:
            if char == "]" and i > class_start:
                in_class = False
            elif char == "[" or pattern.startswith("&&", i):
                raise PatternTranslationError("nested character classes and intersections are Java-only")
            out.append(char)
            i += 1
            continue
        if char == "[":
            in_class = True
            class_start = i + (2 if pattern.startswith("[^", i) else 1)  # a leading "]" is literal
            out.append(pattern[i:class_start])
            i = class_start
            continue
        i = _translate_outside_class(pattern, i, out)
    if in_class:
        raise PatternTranslationError("unterminated character class")
    return "".join(out)


def _translate_outside_class(pattern: str, i: int, out: list[str]) -> int:
    char = pattern[i]
    if char == ".":
        out.append(_JAVA_DOT)
        return i + 1
    if char in "^$":
        out.append(char)
        quantifier = _QUANTIFIER.match(pattern, i + 1)
        return quantifier.end() if quantifier else i + 1
    if pattern.startswith("(?<", i) and i + 3 < len(pattern) and pattern[i + 3].isalpha():
        out.append("(?P<")  # Java's named group; (?<= and (?<! are the same in both
        return i + 3
    out.append(char)
    return i + 1


def _translate_escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """Translate the escape starting at ``pattern[i] == "\\"``; return the text and the next index."""
    if i + 1 >= len(pattern):
        raise PatternTranslationError("trailing backslash")
    kind = pattern[i + 1]
    if kind in "pP":
        name, end = _property_name(pattern, i + 2)
        ranges = _property_ranges(name)
        if kind == "P":
            ranges = _complement(ranges)
        body = _render_ranges(ranges)
        return (body if in_class else f"[{body}]"), end
    if kind == "u":
        return _translate_unicode_escape(pattern, i)
    if kind == "x" and pattern.startswith("{", i + 2):
        end = pattern.index("}", i + 3)
        return f"\\U{int(pattern[i + 3 : end], 16):08X}", end + 1
    if kind == "e":
        return "\\x1b", i + 2
    if kind == "z" and not in_class:
        return "\\Z", i + 2  # Java's \z is Python's \Z (absolute end)
    if kind in _UNSUPPORTED_ESCAPES or (kind == "Z" and not in_class):
        raise PatternTranslationError(f"Java escape \\{kind} has no Python translation")
    return pattern[i : i + 2], i + 2


def _property_name(pattern: str, i: int) -> tuple[str, int]:
    if pattern.startswith("{", i):
        end = pattern.find("}", i)
        if end < 0:
            raise PatternTranslationError("unterminated \\p{...}")
        return pattern[i + 1 : end], end + 1
    if i < len(pattern):
        return pattern[i], i + 1  # the one-letter form, \pL
    raise PatternTranslationError("\\p without a property name")


def _translate_unicode_escape(pattern: str, i: int) -> tuple[str, int]:
    """``\\uHHHH``; a UTF-16 surrogate pair written as two escapes becomes the one code point it means."""
    unit = _hex4(pattern, i + 2)
    end = i + 6
    if 0xD800 <= unit <= 0xDBFF and pattern.startswith("\\u", end):
        low = _hex4(pattern, end + 2)
        if 0xDC00 <= low <= 0xDFFF:
            code_point = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
            return f"\\U{code_point:08X}", end + 6
    return f"\\U{unit:08X}", end


def _hex4(pattern: str, i: int) -> int:
    digits = pattern[i : i + 4]
    if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise PatternTranslationError(f"bad \\u escape at {i}")
    return int(digits, 16)


# Java's POSIX classes are US-ASCII only unless UNICODE_CHARACTER_CLASS is set (the model never sets it).
_POSIX: dict[str, list[tuple[int, int]]] = {
    "Lower": [(0x61, 0x7A)],
    "Upper": [(0x41, 0x5A)],
    "ASCII": [(0x00, 0x7F)],
    "Alpha": [(0x41, 0x5A), (0x61, 0x7A)],
    "Digit": [(0x30, 0x39)],
    "Alnum": [(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)],
    "Punct": [(0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)],
    "Graph": [(0x21, 0x7E)],
    "Print": [(0x20, 0x7E)],
    "Blank": [(0x09, 0x09), (0x20, 0x20)],
    "Cntrl": [(0x00, 0x1F), (0x7F, 0x7F)],
    "XDigit": [(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)],
    "Space": [(0x09, 0x0D), (0x20, 0x20)],
}


def _property_ranges(name: str) -> list[tuple[int, int]]:
    if name in _POSIX:
        return _POSIX[name]
    category = name.removeprefix("Is")  # Java accepts both \p{L} and \p{IsL}
    if category.startswith("general_category="):
        category = category.removeprefix("general_category=")
    table = _category_table()
    if len(category) in (1, 2) and category[0] in "LMNPSZC":
        ranges = sorted(r for cat, rs in table.items() if cat.startswith(category) for r in rs)
        if ranges:
            return _merge(ranges)
    raise PatternTranslationError(f"unsupported Unicode property \\p{{{name}}}")


@lru_cache(maxsize=1)
def _category_table() -> dict[str, list[tuple[int, int]]]:
    """Every code point grouped into ranges by its two-letter general category (~0.2 s, done once).

    Python's Unicode database may be a version or two apart from the JDK's; only newly assigned
    characters differ.
    """
    table: dict[str, list[tuple[int, int]]] = {}
    start, current = 0, unicodedata.category("\x00")
    for code_point in range(1, sys.maxunicode + 2):
        category = unicodedata.category(chr(code_point)) if code_point <= sys.maxunicode else ""
        if category != current:
            table.setdefault(current, []).append((start, code_point - 1))
            start, current = code_point, category
    return table


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for low, high in ranges:
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return merged


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    result, next_free = [], 0
    for low, high in _merge(sorted(ranges)):
        if low > next_free:
            result.append((next_free, low - 1))
        next_free = high + 1
    if next_free <= sys.maxunicode:
        result.append((next_free, sys.maxunicode))
    return result


def _render_ranges(ranges: list[tuple[int, int]]) -> str:
    # \U escapes keep the translated pattern ASCII and free of characters that are special in a class.
    return "".join(f"\\U{lo:08X}" if lo == hi else f"\\U{lo:08X}-\\U{hi:08X}" for lo, hi in ranges)
