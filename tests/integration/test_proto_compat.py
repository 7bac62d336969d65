"""Wire compatibility: every message, enum and RPC that Sluice's .proto files define must match
tritonclient's generated modules (names, field numbers, types, labels, oneofs, map entries).

Sluice's own additions are the one exception, and must be marked as such: messages named Sluice*,
and fields named sluice_* numbered from 1000 in Triton's messages (Triton's clients skip them as
unknown fields).

Our descriptors come from `protoc --descriptor_set_out` (built by CMake); tritonclient's come from
its installed *_pb2 modules, so a drift on either side fails here.
"""
import os

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

DESCRIPTOR_SET = os.environ.get("SLUICE_PROTO_DESCRIPTORS", "")
SLUICE_FIELDS_FROM = 1000  # Sluice's own fields in Triton's messages are numbered from here


def _load_ours():
    if not DESCRIPTOR_SET or not os.path.exists(DESCRIPTOR_SET):
        pytest.fail(f"SLUICE_PROTO_DESCRIPTORS={DESCRIPTOR_SET!r} does not name the descriptor set "
                    "CMake writes (build/proto/sluice_protos.desc)")
    fds = descriptor_pb2.FileDescriptorSet()
    with open(DESCRIPTOR_SET, "rb") as f:
        fds.ParseFromString(f.read())
    return {os.path.basename(f.name): f for f in fds.file}


def _theirs(module):
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _field_sig(field):
    return (field.number, field.label, field.type, field.type_name.lstrip("."),
            field.HasField("oneof_index") and not field.proto3_optional)


def _flatten_messages(prefix, messages, out):
    for m in messages:
        name = f"{prefix}.{m.name}"
        out[name] = m
        _flatten_messages(name, m.nested_type, out)


def _flatten_enums(prefix, file_or_msgs, out, top_enums=()):
    for e in top_enums:
        out[f"{prefix}.{e.name}"] = e
    for m in file_or_msgs:
        name = f"{prefix}.{m.name}"
        for e in m.enum_type:
            out[f"{name}.{e.name}"] = e
        _flatten_enums(name, m.nested_type, out)


def _compare_file(ours, theirs):
    problems = []
    our_msgs, their_msgs = {}, {}
    _flatten_messages(ours.package, ours.message_type, our_msgs)
    _flatten_messages(theirs.package, theirs.message_type, their_msgs)
    assert our_msgs, "no messages parsed from our descriptor set"
    for name, msg in our_msgs.items():
        if msg.name.startswith("Sluice"):
            continue  # ours alone (see the module's note)
        if name not in their_msgs:
            problems.append(f"{name}: not a message in tritonclient")
            continue
        their_fields = {f.name: f for f in their_msgs[name].field}
        for field in msg.field:
            if field.name.startswith("sluice_") and field.number >= SLUICE_FIELDS_FROM:
                continue  # ours alone
            other = their_fields.get(field.name)
            if other is None:
                problems.append(f"{name}.{field.name}: no such field in tritonclient")
            elif _field_sig(field) != _field_sig(other):
                problems.append(f"{name}.{field.name}: ours {_field_sig(field)} "
                                f"theirs {_field_sig(other)}")
        missing = set(their_fields) - {f.name for f in msg.field}
        if missing:
            problems.append(f"{name}: fields missing from ours: {sorted(missing)}")
        if [o.name for o in msg.oneof_decl] != [o.name for o in their_msgs[name].oneof_decl]:
            problems.append(f"{name}: oneofs differ")
    our_enums, their_enums = {}, {}
    _flatten_enums(ours.package, ours.message_type, our_enums, ours.enum_type)
    _flatten_enums(theirs.package, theirs.message_type, their_enums, theirs.enum_type)
    for name, enum in our_enums.items():
        if name not in their_enums:
            problems.append(f"enum {name}: not in tritonclient")
            continue
        ours_values = {v.name: v.number for v in enum.value}
        theirs_values = {v.name: v.number for v in their_enums[name].value}
        if ours_values != theirs_values:
            problems.append(f"enum {name}: ours {ours_values} theirs {theirs_values}")
    return problems, our_msgs, their_msgs


def test_model_config_matches_tritonclient():
    ours = _load_ours()["model_config.proto"]
    problems, our_msgs, their_msgs = _compare_file(ours, _theirs(model_config_pb2))
    missing = set(their_msgs) - set(our_msgs)
    # The whole schema is ours too, so a real config.pbtxt never fails to parse.
    assert not missing, f"messages in tritonclient's model_config missing from ours: {missing}"
    assert not problems, "\n".join(problems)


def test_service_messages_match_tritonclient():
    ours = _load_ours()["grpc_service.proto"]
    theirs = _theirs(service_pb2)
    problems, _, _ = _compare_file(ours, theirs)
    assert not problems, "\n".join(problems)


def test_service_methods_match_tritonclient():
    ours = _load_ours()["grpc_service.proto"]
    theirs = _theirs(service_pb2)
    assert ours.package == "inference"
    (our_service,) = [s for s in ours.service if s.name == "GRPCInferenceService"]
    (their_service,) = [s for s in theirs.service if s.name == "GRPCInferenceService"]
    their_methods = {m.name: m for m in their_service.method}
    for method in our_service.method:
        other = their_methods.get(method.name)
        assert other is not None, f"rpc {method.name} is not in tritonclient's service"
        assert (method.input_type, method.output_type, method.client_streaming,
                method.server_streaming) == (other.input_type, other.output_type,
                                             other.client_streaming, other.server_streaming), method.name
    for name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                 "ModelInfer", "ModelConfig", "RepositoryIndex"):
        assert name in {m.name for m in our_service.method}


def test_only_marked_sluice_additions_are_exempt():
    theirs = _theirs(service_pb2)

    def with_addition(message_name, field_name, number):
        ours = descriptor_pb2.FileDescriptorProto()
        ours.CopyFrom(theirs)
        (message,) = [m for m in ours.message_type if m.name == message_name]
        message.field.add(name=field_name, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        return _compare_file(ours, theirs)[0]

    assert with_addition("ModelStatistics", "sluice_extra", SLUICE_FIELDS_FROM) == []
    assert with_addition("ModelStatistics", "sluice_extra", 99) != []  # in Triton's own number range
    assert with_addition("ModelStatistics", "extra", SLUICE_FIELDS_FROM) != []  # not marked as ours
    ours = descriptor_pb2.FileDescriptorProto()
    ours.CopyFrom(theirs)
    ours.message_type.add(name="SluiceExtra")
    ours.message_type.add(name="Extra")
    assert _compare_file(ours, theirs)[0] == ["inference.Extra: not a message in tritonclient"]


def test_otlp_subset_matches_opentelemetry_proto():
    """proto/otlp_trace.proto declares only the OTLP fields the exporter writes, in a package of
    its own: each of them must have the official definition's number, type and label."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    ours = _load_ours()["otlp_trace.proto"]
    assert ours.package == "sluice.otlp"
    official = {}
    for module in (trace_service_pb2, common_pb2, resource_pb2, trace_pb2):
        for name, message in module.DESCRIPTOR.message_types_by_name.items():
            official[name] = message

    def short(type_name):
        return type_name.rsplit(".", 1)[-1]

    def check(message, theirs, problems):
        fields = {f.name: f for f in theirs.fields}
        for field in message.field:
            other = fields.get(field.name)
            if other is None:
                problems.append(f"{message.name}.{field.name}: not in opentelemetry-proto")
                continue
            their_type = other.message_type.full_name if other.message_type else (
                other.enum_type.full_name if other.enum_type else "")
            if (field.number, field.type, short(field.type_name)) != (other.number, other.type, short(their_type)):
                problems.append(f"{message.name}.{field.name}: ours {(field.number, field.type, field.type_name)} "
                                f"theirs {(other.number, other.type, their_type)}")
            if (field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED) != other.is_repeated:
                problems.append(f"{message.name}.{field.name}: repeated differs")
        nested = {m.name: m for m in theirs.nested_types}
        for inner in message.nested_type:
            if inner.name not in nested:
                problems.append(f"{message.name}.{inner.name}: not in opentelemetry-proto")
            else:
                check(inner, nested[inner.name], problems)
        enums = {e.name: e for e in theirs.enum_types}
        for enum in message.enum_type:
            theirs_values = {v.name: v.number for v in enums[enum.name].values} if enum.name in enums else {}
            for value in enum.value:
                if theirs_values.get(value.name) != value.number:
                    problems.append(f"{message.name}.{enum.name}.{value.name}: differs")

    problems = []
    for message in ours.message_type:
        if message.name not in official:
            problems.append(f"{message.name}: not an OTLP message")
        else:
            check(message, official[message.name], problems)
    assert not problems, "\n".join(problems)
