"""Slurm hostlists, pure: ``hp-n[01-04,07]``, ``gpu[1-3]``, ``login``, several separated by commas.

:func:`expand` turns a hostlist into its names, in order; :func:`compress` turns names back into the
shortest form Slurm prints (each run of names that differ only in their last number becomes one
bracket, numbers ascending, a zero-padded width kept). ``compress(expand(x)) == x`` for a hostlist in
that form, and ``expand(compress(names))`` holds the same names as ``names``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hyperplan.errors import ValidationError

MAX_NAMES = 100_000  # a hostlist that expands to more is refused rather than built
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]*")
_LAST_NUMBER = re.compile(r"(.*?)(\d+)(\D*)")


def expand(hostlist: str) -> tuple[str, ...]:
    """Every name of `hostlist`, in the order written; a ValidationError names what is wrong."""
    names: list[str] = []
    for item in _split(hostlist):
        names.extend(_expand_item(item, hostlist))
        if len(names) > MAX_NAMES:
            raise ValidationError(f"hostlist {hostlist!r} names more than {MAX_NAMES} hosts")
    return tuple(names)


def _split(hostlist: str) -> list[str]:
    """The top-level comma-separated items (commas inside brackets belong to their bracket)."""
    if not hostlist.strip():
        raise ValidationError("a hostlist is empty")
    items, depth, start = [], 0, 0
    for index, char in enumerate(hostlist):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValidationError(f"hostlist {hostlist!r}: nested '['")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValidationError(f"hostlist {hostlist!r}: ']' without '['")
        elif char == "," and depth == 0:
            items.append(hostlist[start:index])
            start = index + 1
    if depth:
        raise ValidationError(f"hostlist {hostlist!r}: '[' without ']'")
    items.append(hostlist[start:])
    for item in items:
        if not item:
            raise ValidationError(f"hostlist {hostlist!r}: an empty name between commas")
    return items


def _expand_item(item: str, hostlist: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        _check_chars(item, hostlist)
        return [item]
    close_at = item.index("]", open_at)
    prefix, ranges, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    _check_chars(prefix, hostlist)
    tails = _expand_item(rest, hostlist) if rest else [""]
    if not prefix and not tails[0]:
        raise ValidationError(f"hostlist {hostlist!r}: a bracket without a name around it")
    return [f"{prefix}{number}{tail}" for number in _numbers(ranges, hostlist) for tail in tails]


def _check_chars(text: str, hostlist: str) -> None:
    if not _NAME_CHARS.fullmatch(text):
        raise ValidationError(
            f"hostlist {hostlist!r}: {text!r} is not a host name (letters, digits, '.', '_', '-')"
        )


def _numbers(ranges: str, hostlist: str) -> list[str]:
    numbers: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ValidationError(f"hostlist {hostlist!r}: {part!r} is not a number or a range a-b")
        low_text, high_text = match[1], match[2] or match[1]
        low, high = int(low_text), int(high_text)
        if low > high:
            raise ValidationError(f"hostlist {hostlist!r}: range {part!r} runs backwards")
        if high - low >= MAX_NAMES:
            raise ValidationError(f"hostlist {hostlist!r} names more than {MAX_NAMES} hosts")
        width = len(low_text)
        numbers.extend(f"{n:0{width}d}" for n in range(low, high + 1))
    return numbers


def compress(names: Iterable[str]) -> str:
    """The shortest hostlist of `names` (duplicates once); groups in order of first appearance."""
    unique = list(dict.fromkeys(names))
    if not unique:
        raise ValidationError("no host names to make a hostlist of")
    split = {name: _LAST_NUMBER.fullmatch(name) for name in unique}
    # The widths zero-padded numbers fix, per (prefix, suffix): a number without a leading zero joins
    # the widest of them it fits, since formatting it to that width gives it back unchanged.
    padded: dict[tuple[str, str], set[int]] = {}
    for match in split.values():
        if match is not None and _is_padded(match[2]):
            padded.setdefault((match[1], match[3]), set()).add(len(match[2]))
    groups: dict[tuple[str, str, int] | str, list[int]] = {}
    for name, match in split.items():
        if match is None:
            groups.setdefault(name, [])
            continue
        prefix, digits, suffix = match[1], match[2], match[3]
        if _is_padded(digits):
            width = len(digits)
        else:
            width = max((w for w in padded.get((prefix, suffix), ()) if w <= len(digits)), default=0)
        groups.setdefault((prefix, suffix, width), []).append(int(digits))
    return ",".join(_group(key, numbers) for key, numbers in groups.items())


def _is_padded(digits: str) -> bool:
    return len(digits) > 1 and digits.startswith("0")


def _group(key: tuple[str, str, int] | str, numbers: list[int]) -> str:
    if isinstance(key, str):
        return key
    prefix, suffix, width = key
    ordered = sorted(set(numbers))
    if len(ordered) == 1:
        return f"{prefix}{ordered[0]:0{width}d}{suffix}"
    runs: list[str] = []
    start = previous = ordered[0]
    for number in [*ordered[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        runs.append(f"{start:0{width}d}" if start == previous else f"{start:0{width}d}-{previous:0{width}d}")
        if number is not None:
            start = previous = number
    return f"{prefix}[{','.join(runs)}]{suffix}"
