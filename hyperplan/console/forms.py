"""Form bodies read once, and their fields checked, each error kept next to the field it names.

Bodies are ``application/x-www-form-urlencoded`` (the console's forms post nothing else), parsed with
the standard library: no multipart parser is needed. The body was already read and capped by the
server's front door (server/body_limit.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from urllib.parse import parse_qsl

from hyperplan.core.user_times import parse_time
from hyperplan.errors import HyperplanError, ValidationError

MAX_FIELDS = 200


class Form:
    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    @classmethod
    def parse(cls, body: bytes) -> Form:
        try:
            text = body.decode()
            pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FIELDS)
        except ValueError:  # not UTF-8, or too many fields: a form the console never sends
            pairs = []
        return cls(pairs)

    def get(self, name: str, default: str = "") -> str:
        return next((value for key, value in self._pairs if key == name), default)

    def get_all(self, name: str) -> list[str]:
        return [value for key, value in self._pairs if key == name]

    def values(self) -> dict[str, str]:
        """The first value of each field: what a re-rendered form shows back."""
        found: dict[str, str] = {}
        for key, value in self._pairs:
            found.setdefault(key, value)
        return found


class FieldErrors(Exception):
    """One message per field (the key "" is the form's own, shown above it)."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        super().__init__("; ".join(errors.values()))
        self.errors = dict(errors)


class Fields:
    """Reads a form's fields; each bad one leaves its message in `errors` and reads as None."""

    def __init__(self, form: Form) -> None:
        self.form = form
        self.errors: dict[str, str] = {}

    def text(self, name: str, label: str, *, required: bool = True, max_length: int = 256) -> str:
        value = self.form.get(name).strip()
        if required and not value:
            self.errors[name] = f"{label} is required."
        elif len(value) > max_length:
            self.errors[name] = f"{label} is at most {max_length} characters."
        return value

    def whole(self, name: str, label: str, minimum: int, maximum: int) -> int | None:
        value = self.form.get(name).strip()
        if not value:
            self.errors[name] = f"{label} is required."
            return None
        if not value.isdigit() or not minimum <= int(value) <= maximum:
            self.errors[name] = f"{label} must be a whole number from {minimum} to {maximum}."
            return None
        return int(value)

    def moment(self, name: str, label: str, now: datetime) -> datetime | None:
        """A time in the CLI's one syntax (core/user_times.py: a date, a date and time, UTC unless a zone
        is given, `now`, `+3d`), a relative one counted from `now`, the service clock's; blank is None."""
        value = self.form.get(name).strip()
        if not value:
            return None
        try:
            return parse_time(value, now)
        except ValidationError as exc:
            self.errors[name] = f"{label}: {exc.message}"
            return None

    def check(self) -> None:
        if self.errors:
            raise FieldErrors(self.errors)


def place(error: HyperplanError, members: Mapping[str, str]) -> FieldErrors:
    """A service's refusal, shown next to the field whose wire member its message names first (members:
    wire member -> field), or above the form when it names none."""
    message = error.message
    named = [(message.find(member), field) for member, field in members.items() if member in message]
    field = min(named)[1] if named else ""
    return FieldErrors({field: message})
