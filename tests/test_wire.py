"""The header mutation the gate writes in protobuf's wire format is the message Envoy reads."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import given
from hypothesis import strategies as st

from extproc.wire import _mutation

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=300)
values = st.text(max_size=3000)  # past 127 and 16,383 bytes: lengths of two and three bytes


def built(set_headers: dict[str, str], remove: list[str]) -> pb.HeaderMutation:
    """The same mutation built field by field."""
    option, value = base_pb2.HeaderValueOption, base_pb2.HeaderValue
    return pb.HeaderMutation(
        set_headers=[
            option(header=value(key=k, raw_value=v.encode()), append_action=option.OVERWRITE_IF_EXISTS_OR_ADD)
            for k, v in set_headers.items()
        ],
        remove_headers=remove,
    )


@given(st.dictionaries(names, values, max_size=20), st.lists(names, max_size=5))
def test_wire_format_mutation_is_the_message_built_field_by_field(
    set_headers: dict[str, str], remove: list[str]
) -> None:
    ours = _mutation(set_headers, remove)
    assert ours == built(set_headers, remove)
    assert ours.SerializeToString() == built(set_headers, remove).SerializeToString()


def test_header_order_and_overwrite_are_kept() -> None:
    m = _mutation({"x-gate-cache": "hit", "content-length": "12"}, ["authorization"])
    assert [(o.header.key, o.header.raw_value, o.append_action) for o in m.set_headers] == [
        ("x-gate-cache", b"hit", base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD),
        ("content-length", b"12", base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD),
    ]
    assert list(m.remove_headers) == ["authorization"]
