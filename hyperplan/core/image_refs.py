"""Image references: a job's TrainingImage checked, and mapped to where the organisation keeps the image.

A reference follows the OCI/Docker grammar (distribution's reference package, which podman and docker
use): ``[HOST[:PORT]/]PATH[:TAG][@DIGEST]``. PATH is components of lower-case letters and digits joined
by ``.``, ``_``, ``__`` or dashes, separated by ``/``; the whole name (host and path) is at most 255
characters; a tag is 1-128 of letters, digits, ``_``, ``.`` and ``-``, not starting with ``.`` or ``-``; a
digest is ``ALGORITHM:HEX`` (``sha256:`` and 64 lower-case hex digits, for instance). The first component
is a registry host when it has a ``.`` or a ``:``, is ``localhost``, or has a capital letter (Docker's
rule); otherwise the reference names none, and a runtime pulls it from Docker Hub. botocore's bound on
TrainingImage (at most 255 characters, any text) is the outer one; the grammar is checked inside it.

The fleet file's ``[image_map]`` (:class:`ImageMap`) maps TrainingImage URIs to references: an entry
``"URI" = "REFERENCE"`` maps one URI; ``"PREFIX*" = "REFERENCE-PREFIX*"`` maps every URI that starts with
PREFIX, appending what follows the prefix to REFERENCE-PREFIX; ``"PREFIX*" = "REFERENCE"`` (no ``*``) maps
every such URI to that one reference. An exact entry wins over a prefix, and a longer prefix over a
shorter one. A URI no entry maps resolves to itself. ``[registries."HOST[:PORT]"]`` says whether a
registry is reached over plain HTTP (``insecure``).

Pure: values in, values out; every refusal a ValidationError that says what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hyperplan.errors import ValidationError

MAX_URI_LENGTH = 255  # botocore's bound on AlgorithmSpecification.TrainingImage (AlgorithmImage)
MAX_NAME_LENGTH = 255  # the grammar's bound on a reference's name: its host and path
DEFAULT_REGISTRY = "docker.io"  # where a runtime pulls a reference that names no registry
PREFIX_MARK = "*"

_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::([0-9]+))?")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*):([0-9a-fA-F]{32,})")
# The digests the OCI image spec registers, with the length of their hex (lower-case only).
_REGISTERED_DIGESTS = {"sha256": 64, "sha512": 128}
# What a prefix of a reference may hold (checked where the whole cannot be: a prefix entry's key and
# target); the resolved reference is checked in full.
_REFERENCE_CHARACTERS = re.compile(r"[A-Za-z0-9._/:@\[\]+-]*")


@dataclass(frozen=True)
class ImageReference:
    """A reference that passed the grammar, in its parts; ``str()`` gives it back as written."""

    registry: str | None  # HOST[:PORT] as written; None: the reference names no registry
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def registry_host(self) -> str:
        """The registry a runtime pulls from, lower-cased (host names are not case-sensitive): the one
        named, else Docker Hub."""
        return (self.registry or DEFAULT_REGISTRY).lower()

    def __str__(self) -> str:
        name = f"{self.registry}/{self.path}" if self.registry else self.path
        return name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse_image(text: str) -> ImageReference:
    """`text` as a reference, or a ValidationError that says what is wrong with it."""
    try:
        return _parse(text)
    except ValueError as why:
        raise ValidationError(f"{text!r} is not an image reference: {why}") from None


def check_training_image(uri: str) -> ImageReference:
    """A TrainingImage: botocore's bound, then the grammar."""
    if len(uri) > MAX_URI_LENGTH:
        raise ValidationError(f"{uri[:40]!r}... is {len(uri)} characters long; at most {MAX_URI_LENGTH}")
    return parse_image(uri)


def parse_registry_host(text: str) -> str:
    """A registry's ``HOST[:PORT]`` (a name, an IPv4 address or a bracketed IPv6 one), lower-cased; a
    ValidationError that says what it may be."""
    if len(text) > MAX_NAME_LENGTH:
        raise ValidationError(f"a registry is at most {MAX_NAME_LENGTH} characters, not {len(text)}")
    try:
        _check_host(text)
    except ValueError as why:
        raise ValidationError(f"{text!r} is not a registry: {why}") from None
    return text.lower()


def _parse(text: str) -> ImageReference:
    if not text:
        raise ValueError("it is empty")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError("it holds a space or a control character")
    rest, at, digest = text.partition("@")
    if at:
        _check_digest(digest)
    name, tag = _split_tag(rest)
    if tag is not None and not _TAG.fullmatch(tag):
        raise ValueError(
            f"the tag {tag!r} must be 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
        )
    if not name:
        raise ValueError("it names no repository")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"its name (registry and repository) is {len(name)} characters; at most 255")
    registry, path = _split_registry(name)
    if registry is not None:
        _check_host(registry)
    for component in path.split("/"):
        _check_path_component(component)
    return ImageReference(registry, path, tag, digest if at else None)


def _split_tag(rest: str) -> tuple[str, str | None]:
    """The tag follows the last ':' after the last '/' (a ':' before it is a registry's port)."""
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        return rest[:colon], rest[colon + 1 :]
    return rest, None


def _split_registry(name: str) -> tuple[str | None, str]:
    first, slash, remainder = name.partition("/")
    names_a_host = "." in first or ":" in first or first == "localhost" or first != first.lower()
    if slash and names_a_host:
        return first, remainder
    return None, name


def _check_host(host: str) -> None:
    found = _HOST.fullmatch(host)
    if found is None:
        raise ValueError(
            f"the registry {host!r} must be a host name, an IPv4 address or a bracketed IPv6 address, with "
            "an optional :PORT (such as registry.example.com or 127.0.0.1:5000)"
        )
    port = found.group(1)
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"the registry {host!r} has port {port}; a port is 1-65535")


def _check_path_component(component: str) -> None:
    if _PATH_COMPONENT.fullmatch(component):
        return
    if not component:
        raise ValueError("its repository path has an empty component (two '/' in a row, or one at an end)")
    if _PATH_COMPONENT.fullmatch(component.lower()):
        raise ValueError(f"the repository path component {component!r} must be lower-case")
    raise ValueError(
        f"the repository path component {component!r} must be lower-case letters and digits, joined by "
        "'.', '_', '__' or dashes"
    )


def _check_digest(digest: str) -> None:
    found = _DIGEST.fullmatch(digest)
    if found is None:
        raise ValueError(
            f"the digest {digest!r} must be ALGORITHM:HEX, such as sha256: and 64 hex digits (at least 32)"
        )
    algorithm, hexdigits = found.groups()
    length = _REGISTERED_DIGESTS.get(algorithm)
    if length is not None and (len(hexdigits) != length or hexdigits != hexdigits.lower()):
        raise ValueError(f"a {algorithm} digest is {length} lower-case hex digits, not {hexdigits!r}")


# -- the image map ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mapped:
    """Where a URI resolves, and the image map's entry that sent it there (None: no entry, as written)."""

    reference: ImageReference
    entry: str | None = None


@dataclass(frozen=True)
class ImageMap:
    """The fleet file's ``[image_map]``, checked (:func:`build_image_map`)."""

    exact: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # (prefix without its '*', target as written), the longest prefix first
    prefixes: tuple[tuple[str, str], ...] = ()

    def lookup(self, uri: str) -> tuple[str, str | None]:
        """The text `uri` maps to and the entry that maps it: an exact entry, else the longest prefix;
        `uri` itself and None when no entry does."""
        if uri in self.exact:
            return self.exact[uri], uri
        for prefix, target in self.prefixes:
            if uri.startswith(prefix):
                if target.endswith(PREFIX_MARK):
                    return target[:-1] + uri[len(prefix) :], prefix + PREFIX_MARK
                return target, prefix + PREFIX_MARK
        return uri, None

    def resolve(self, uri: str) -> Mapped:
        """A TrainingImage resolved: `uri` checked (a ValidationError says what is wrong), then mapped;
        a mapping whose result is not a reference is refused, naming the entry."""
        checked = check_training_image(uri)
        text, entry = self.lookup(uri)
        if entry is None:
            return Mapped(checked)
        try:
            return Mapped(_parse(text), entry)
        except ValueError as why:
            raise ValidationError(
                f"the fleet's image_map entry {entry!r} maps {uri!r} to {text!r}, which is not an image "
                f"reference: {why}"
            ) from None


def build_image_map(entries: Mapping[str, object]) -> ImageMap:
    """The image map of ``[image_map]``'s entries; a ValidationError names the first wrong entry's key
    (``image_map."KEY": ...``)."""
    exact: dict[str, str] = {}
    prefixes: list[tuple[str, str]] = []
    for key, target in entries.items():
        where = f'image_map."{key}"'
        try:
            if key.endswith(PREFIX_MARK):
                prefixes.append((_checked_prefix(key[:-1], "a prefix entry's key"), _checked_target(target)))
            else:
                exact[key] = _checked_exact(key, target)
        except (ValueError, ValidationError) as why:
            message = why.message if isinstance(why, ValidationError) else str(why)
            raise ValidationError(f"{where}: {message}") from None
    prefixes.sort(key=lambda entry: len(entry[0]), reverse=True)
    return ImageMap(MappingProxyType(exact), tuple(prefixes))


def _checked_exact(key: str, target: object) -> str:
    if PREFIX_MARK in key:
        raise ValueError("a '*' may only end a key (a prefix entry)")
    check_training_image(key)
    if not isinstance(target, str):
        raise ValueError(f"{target!r} is not a string: give an image reference")
    if target.endswith(PREFIX_MARK):
        raise ValueError(
            'an exact entry maps to one reference; only a prefix entry ("PREFIX*") may end its target '
            "in '*' to append the rest of the URI"
        )
    parse_image(target)
    return target


def _checked_target(target: object) -> str:
    if not isinstance(target, str):
        raise ValueError(
            f"{target!r} is not a string: give an image reference, or a reference prefix and '*'"
        )
    if target.endswith(PREFIX_MARK):
        _checked_prefix(target[:-1], "a target prefix")
    else:
        parse_image(target)
    return target


def _checked_prefix(prefix: str, what: str) -> str:
    if not prefix:
        raise ValueError(f"{what} is empty: '*' alone would map every image")
    if PREFIX_MARK in prefix:
        raise ValueError("a '*' may only end a key or a target")
    if not _REFERENCE_CHARACTERS.fullmatch(prefix):
        raise ValueError(f"{what} {prefix!r} holds characters no image reference has")
    if len(prefix) > MAX_URI_LENGTH:
        raise ValueError(f"{what} is {len(prefix)} characters long; at most {MAX_URI_LENGTH}")
    return prefix


# -- registries ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registry:
    """One ``[registries."HOST[:PORT]"]`` table."""

    host: str  # lower-cased
    insecure: bool = False  # plain HTTP (and no TLS check): a registry on loopback or a trusted network


@dataclass(frozen=True)
class ImageSources:
    """Where training images come from: the image map and the registries the fleet file describes."""

    image_map: ImageMap = field(default_factory=ImageMap)
    registries: Mapping[str, Registry] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def resolve(self, uri: str) -> Mapped:
        return self.image_map.resolve(uri)

    def insecure(self, host: str) -> bool:
        """Whether the registry at `host` (HOST[:PORT]) is reached over plain HTTP."""
        registry = self.registries.get(host.lower())
        return registry is not None and registry.insecure
