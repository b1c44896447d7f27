"""A dataset's columns: roles and their default names, ``--column`` overrides, type checks, pass-through types.

Used by :func:`recall_tasks.io.datasets.open_dataset`, which reads every file's footer and hands its schema here;
nothing in this module reads data.

- Column roles have default names covering deepeval, ragas and Mastra; ``--column role=name`` overrides.
- A required column missing or of the wrong type is one :class:`DatasetError` naming file, column, expected and
  found type (``expected list<string>, found ...``); so are duplicate column names in a file, also names that differ
  only in case (Delta names are case-insensitive), and a file whose schema differs from the first file's.

Pass-through columns are validated here (through ``open_dataset``), before any judge call, and stored with a
type Delta Lake and its readers handle (:func:`stored_type`); casts are lossless except where said:
- timestamps of any unit become microseconds (Delta stores microseconds; a ``timestamp[ns]`` column, what pandas
  writes, would otherwise create a table no reader of this project can open). Values that are not whole
  microseconds are TRUNCATED to the microsecond, never refused: a sub-microsecond part is noise for a benchmark's
  metadata column. A zoned timestamp is stored in UTC (the same instant; Delta refuses other zones);
- ``uint8``/``uint16``/``uint32`` become the next wider signed integer; ``uint64`` becomes ``decimal(20, 0)``
  (Delta has no unsigned types and values >= 2^63 do not fit a ``long``); ``float16`` becomes ``float32``;
  ``decimal256`` of precision <= 38 becomes ``decimal128``; ``date64`` becomes ``date32``; an all-null column
  becomes ``string``; dictionary-encoded columns (pandas categoricals) are stored as their values; string, binary
  and list flavours (large, view, fixed-size) become the plain ones; lists, structs and maps are checked item by
  item;
- refused: time-of-day (``time32``/``time64``), ``duration``, intervals, ``decimal256`` above precision 38,
  unions and extension types (Delta Lake has no such type): one DatasetError naming file, column and type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa

from recall_tasks.errors import DatasetError

#: the role columns a judge reads, in the order a row's content hash takes them (``RowBlock``)
JUDGED_ROLES = ("input", "expected_output", "retrieval_context", "actual_output")
#: The id roles (ragas' names): retrieved ids in rank order, relevant ids, their graded relevance (issue 41)
ID_ROLES = ("retrieved_context_ids", "reference_context_ids", "reference_context_relevance")
ROLES = (*JUDGED_ROLES, "row_id", "messages", *ID_ROLES)

DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "input": ("input", "user_input", "question", "query"),
    "expected_output": ("expected_output", "reference", "ground_truth", "groundTruth", "expected_answer"),
    "retrieval_context": ("retrieval_context", "retrieved_contexts", "context", "contexts"),
    "actual_output": ("actual_output", "response", "output", "answer"),
    "row_id": ("row_id",),
    "messages": ("messages",),  # an agent trace; a role only with --context-from/--context-extractor (io/traces.py)
    **{role: (role,) for role in ID_ROLES},
}

REQUIRED: dict[str, tuple[str, ...]] = {
    "contextual_recall": ("expected_output", "retrieval_context"),
    "context_coverage": ("actual_output", "retrieval_context"),
    "retrieval_ids": (),  # the ids may come from --qrels, --retrieval-uri or --retriever: pipeline/ids_step.py
}


#: The roles whose CSV cells are read as text, never type-inferred (``io/textfiles.py``): the ids (``001`` is not 1)
#: and the text (a question ``42`` is text); the context list is JSON text, decoded.
TEXT_ROLES = ("row_id", "input", "expected_output", "actual_output", "messages", *ID_ROLES)


def text_columns(overrides: Mapping[str, str]) -> tuple[str, ...]:
    """The CSV columns read as text: each text role's ``--column`` name, else every one of its default names."""
    names = [n for role in TEXT_ROLES for n in ((overrides[role],) if role in overrides else DEFAULT_NAMES[role])]
    return tuple(dict.fromkeys(names))


_LIST_TYPES = (pa.types.is_list, pa.types.is_large_list, pa.types.is_list_view, pa.types.is_fixed_size_list)


def _is_string(t: pa.DataType) -> bool:
    """Text: a string flavour, or dictionary-encoded strings (pandas categoricals; cast to string when read)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


class _Unstorable(ValueError):
    """A pass-through type the results table cannot hold; the message says why and what to do."""


def stored_type(t: pa.DataType) -> pa.DataType:
    """The type a pass-through column is stored with (see the module docstring); raises ``_Unstorable``."""
    if pa.types.is_dictionary(t):
        return stored_type(t.value_type)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)  # Delta stores instants in UTC, refuses other zones
    if pa.types.is_time(t):
        raise _Unstorable("Delta Lake has no time-of-day type: cast it to string (or drop it) before the run")
    if pa.types.is_duration(t) or pa.types.is_interval(t):
        raise _Unstorable("Delta Lake has no duration type: cast it to int64 (e.g. microseconds) or string")
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(t.bit_width) or pa.decimal128(20, 0)
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise _Unstorable(f"Delta Lake decimals hold at most 38 digits, this one {t.precision}")
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_null(t) or _is_string(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if any(f(t) for f in _LIST_TYPES):
        return pa.list_(stored_type(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(stored_type(t.key_type), stored_type(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, stored_type(f.type)) for f in t])
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_binary(t):
        return t
    if pa.types.is_date32(t):
        return t
    raise _Unstorable("Delta Lake has no such type: cast it to a string or number column (or drop it)")


def _is_string_list(t: pa.DataType) -> bool:
    return any(f(t) for f in _LIST_TYPES) and (_is_string(t.value_type) or pa.types.is_null(t.value_type))


def parse_column_overrides(pairs: list[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["input=question_text", ...]`` -> ``{"input": "question_text"}``, roles checked."""
    if not pairs:
        return {}
    items = pairs.items() if isinstance(pairs, Mapping) else [p.split("=", 1) if "=" in p else (p, "") for p in pairs]
    out: dict[str, str] = {}
    for role, name in items:
        role = role.strip()
        if role not in ROLES:
            raise DatasetError(f"--column {role}={name}: unknown role {role!r}; roles are {', '.join(ROLES)}")
        if not name:
            raise DatasetError(f"--column {role}: expected role=column_name")
        out[role] = name.strip()
    return out


def type_name(t: pa.DataType) -> str:
    """A type as users read it: ``list<string>`` (pyarrow and Delta name list items differently)."""
    return str(t).replace("item: ", "").replace("element: ", "")


def check_same_schema(schema0: pa.Schema, uri0: str, schema: pa.Schema, uri: str, role_columns: Iterable[str]) -> None:
    """Every file must have the first file's columns with the same types.

    Role columns may differ in string flavour (``string``/``large_string``, ``list``/``large_list``): they are
    cast when read. Pass-through columns must match exactly: they are copied to the results as they are.
    """
    names0, names = set(schema0.names), set(schema.names)
    missing = [n for n in schema0.names if n not in names]
    if missing:
        raise DatasetError(
            f"schema differs from the first file {uri0}: column(s) {', '.join(map(repr, missing))} missing",
            uri=uri,
            column=missing[0],
        )
    extra = [n for n in schema.names if n not in names0]
    if extra:
        raise DatasetError(
            f"schema differs from the first file {uri0}: extra column(s) {', '.join(map(repr, extra))}",
            uri=uri,
            column=extra[0],
        )
    roles = set(role_columns)
    for name in schema0.names:
        t0, t = schema0.field(name).type, schema.field(name).type
        if t0 == t:
            continue
        if name in roles and ((_is_string(t0) and _is_string(t)) or (_is_string_list(t0) and _is_string_list(t))):
            continue
        raise DatasetError(
            f"schema differs from the first file {uri0}: expected {type_name(t0)}, found {type_name(t)}",
            uri=uri,
            column=name,
        )


def resolve_columns(
    schema: pa.Schema,
    overrides: Mapping[str, str],
    metric: str,
    uri: str,
    context_supplied: bool = False,
    traces: bool = False,
) -> dict[str, str]:
    names = set(schema.names)
    columns: dict[str, str] = {}
    for role in ROLES:
        if role == "messages" and not traces:
            continue  # without a trace option a messages column is an ordinary pass-through column
        if role in overrides:
            if overrides[role] not in names:
                raise DatasetError(
                    f"column {overrides[role]!r} given for {role} is not in the file; it has {', '.join(schema.names)}",
                    uri=uri,
                    column=overrides[role],
                )
            columns[role] = overrides[role]
            continue
        for candidate in DEFAULT_NAMES[role]:
            if candidate in names:
                columns[role] = candidate
                break
    for role in REQUIRED[metric]:
        if role == "retrieval_context" and context_supplied:
            continue
        if role not in columns:
            raise DatasetError(
                f"no {role} column for {metric}: expected one of {', '.join(DEFAULT_NAMES[role])} or "
                f"--column {role}=NAME; the file has {', '.join(schema.names)}",
                uri=uri,
                column=role,
            )
    if traces and "messages" not in columns:
        raise DatasetError(
            f"no messages column for --context-from/--context-extractor: expected messages or --column "
            f"messages=NAME; the file has {', '.join(schema.names)}",
            uri=uri, column="messages",
        )  # fmt: skip
    for role, col in columns.items():
        t = schema.field(col).type
        if role == "messages":
            if not (_is_string(t) or (any(f(t) for f in _LIST_TYPES) and pa.types.is_struct(t.value_type))):
                raise DatasetError(
                    f"messages: expected list<struct> (chat messages) or string (their JSON), found {type_name(t)}",
                    uri=uri, column=col,
                )  # fmt: skip
        elif role in ID_ROLES:
            _check_ids(role, t, uri, col)
        elif role == "retrieval_context":
            if not _is_string_list(t):
                raise DatasetError(f"{role}: expected list<string>, found {type_name(t)}", uri=uri, column=col)
        elif role == "row_id":
            if not (_is_string(t) or pa.types.is_integer(t)):
                raise DatasetError(f"row_id: expected string or integer, found {type_name(t)}", uri=uri, column=col)
        elif not (_is_string(t) or pa.types.is_null(t)):
            raise DatasetError(f"{role}: expected string, found {type_name(t)}", uri=uri, column=col)
    return columns


def _check_ids(role: str, t: pa.DataType, uri: str, col: str) -> None:
    """Ids: a list of strings or integers (they compare as strings); relevance: a list of integers (whole floats
    pass here, a fraction is refused when the values are read: ``metrics/ids_compute.normalise_relevance``)."""
    item = t.value_type if any(f(t) for f in _LIST_TYPES) else None
    if role == "reference_context_relevance":
        if item is None or not (pa.types.is_integer(item) or pa.types.is_floating(item) or pa.types.is_null(item)):
            raise DatasetError(f"{role}: expected list<int64> (grades), found {type_name(t)}", uri=uri, column=col)
    elif item is None or not (_is_string(item) or pa.types.is_integer(item) or pa.types.is_null(item)):
        raise DatasetError(
            f"{role}: expected list<string> or list<int64> (document ids), found {type_name(t)}", uri=uri, column=col
        )


def check_unique_names(schema: pa.Schema, uri: str) -> None:
    """Every column name once, also ignoring case (Delta Lake and most SQL engines do)."""
    seen: dict[str, str] = {}
    for name in schema.names:
        other = seen.get(name.lower())
        if other is not None:
            what = (
                f"column {name!r} appears twice"
                if other == name
                else f"columns {other!r} and {name!r} differ only in case"
            )
            raise DatasetError(f"duplicate column names: {what}; give every column a unique name", uri=uri, column=name)
        seen[name.lower()] = name


def passthrough_types(schema: pa.Schema, passthrough: list[str], uri: str) -> dict[str, pa.DataType]:
    """The stored type of each pass-through column, or one DatasetError naming file, column and found type.

    Also refuses names that would collide in the results table: a name of a result column (compared ignoring
    case) is stored as ``data_<name>``, which must not be another pass-through column.
    """
    from recall_tasks.io.schemas import passthrough_name

    types: dict[str, pa.DataType] = {}
    stored: dict[str, str] = {}
    for name in passthrough:
        t = schema.field(name).type
        try:
            types[name] = stored_type(t)
        except _Unstorable as why:
            raise DatasetError(
                f"pass-through column of type {type_name(t)} cannot be stored in the results table: {why}",
                uri=uri, column=name,
            ) from None  # fmt: skip
        target = passthrough_name(name)
        other = stored.get(target.lower())
        if other is not None:
            raise DatasetError(
                f"pass-through columns {other!r} and {name!r} would both be stored as {target!r} (result column "
                "names are compared ignoring case, a colliding one becomes data_<name>); rename one",
                uri=uri, column=name,
            )  # fmt: skip
        stored[target.lower()] = name
    return types
