import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.hostlist import compress, expand
from hyperplan.errors import ValidationError


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("login", ("login",)),
        ("hp-n[01-04,07]", ("hp-n01", "hp-n02", "hp-n03", "hp-n04", "hp-n07")),
        ("gpu[1-3]", ("gpu1", "gpu2", "gpu3")),
        ("gpu[9-11]", ("gpu9", "gpu10", "gpu11")),
        ("n[098-101]", ("n098", "n099", "n100", "n101")),
        ("a,b[2-3],c", ("a", "b2", "b3", "c")),
        ("gpu[1-2],cpu[01-02]", ("gpu1", "gpu2", "cpu01", "cpu02")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("n[5]", ("n5",)),
        ("gpu1.ib", ("gpu1.ib",)),
        ("n[1-2].ib", ("n1.ib", "n2.ib")),
    ],
)
def test_expand(hostlist: str, names: tuple[str, ...]) -> None:
    assert expand(hostlist) == names


@pytest.mark.parametrize(
    ("names", "hostlist"),
    [
        (["login"], "login"),
        (["hp-n04", "hp-n01", "hp-n03", "hp-n02", "hp-n07"], "hp-n[01-04,07]"),
        (["gpu1", "gpu2", "gpu3"], "gpu[1-3]"),
        (["gpu9", "gpu10", "gpu11"], "gpu[9-11]"),
        (["n098", "n099", "n100"], "n[098-100]"),  # 100 fits the padded width of 098
        (["n1", "n01"], "n1,n01"),  # different names: the padding is part of a name
        (["a", "b2", "b3", "a", "c"], "a,b[2-3],c"),
        (["hp-n05"], "hp-n05"),
        (["n1.ib", "n2.ib"], "n[1-2].ib"),
        (["x1y2", "x1y3"], "x1y[2-3]"),
    ],
)
def test_compress(names: list[str], hostlist: str) -> None:
    assert compress(names) == hostlist


@pytest.mark.parametrize(
    ("hostlist", "message"),
    [
        ("", "a hostlist is empty"),
        ("n[1-3", "'[' without ']'"),
        ("n1-3]", "']' without '['"),
        ("n[[1]]", "nested '['"),
        ("n[3-1]", "range '3-1' runs backwards"),
        ("n[a-b]", "'a-b' is not a number or a range"),
        ("n[1,,2]", "'' is not a number"),
        ("a,,b", "an empty name between commas"),
        ("[1-3]", "a bracket without a name"),
        ("gpu 1", "'gpu 1' is not a host name"),
        ("n[0-999999]", "names more than 100000 hosts"),
    ],
)
def test_refusals_say_what_is_wrong(hostlist: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        expand(hostlist)


def test_compress_needs_a_name() -> None:
    with pytest.raises(ValidationError, match="no host names"):
        compress([])


_names = st.lists(
    st.builds(
        lambda prefix, number, width: f"{prefix}{number:0{width}d}",
        st.sampled_from(["gpu", "hp-n", "a.b-", "n"]),
        st.integers(min_value=0, max_value=120),
        st.integers(min_value=1, max_value=3),
    )
    | st.sampled_from(["login", "head", "gpu"]),
    min_size=1,
    max_size=20,
)


@given(_names)
def test_compress_keeps_every_name_and_is_canonical(names: list[str]) -> None:
    hostlist = compress(names)
    assert sorted(set(expand(hostlist))) == sorted(set(names))
    assert len(expand(hostlist)) == len(set(names))  # each name once
    assert compress(expand(hostlist)) == hostlist  # the compressed form is a fixed point
