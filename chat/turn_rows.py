"""The rows a turn's start and end write and read, as hand-written SQL (chat.conversations'
`do_start_exchange` calls them inside its transaction, `do_finish_message` at the end): the
conversation with the user's custom instructions, the prompt and answer inserts, the leaf
update, the finished answer's row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from django.core.exceptions import ValidationError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.utils import timezone

from chat.models import Conversation, Message
from chat.preferences import custom_instructions, instructions_subquery

# The turn's start, written out: each statement built once per database vendor from the models'
# tables, columns and fields; compiling the ORM's querysets and inserts took several times what
# the statements take (docs/decisions/performance.md, issue 18). `db` is the connection itself,
# looked up once per turn (`django.db.connection` is a proxy that looks it up on every use).
_SQL: dict[tuple[str, str], str] = {}

Builder = Callable[[Callable[[str], str]], str]


def _sql(db: BaseDatabaseWrapper, name: str, build: Builder) -> str:
    sql = _SQL.get((db.vendor, name))
    if sql is None:
        sql = _SQL[(db.vendor, name)] = build(db.ops.quote_name)
    return sql


# Fields whose Python values the database drivers take as they are: for a value of the field's
# own type their get_db_prep_save returns it unchanged, so it is not called per row. Any other
# field (a UUID, a datetime, JSON) goes through its own get_db_prep_save, as with the ORM.
_AS_IS = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "BigIntegerField",
        "BooleanField",
        "CharField",
        "IntegerField",
        "PositiveIntegerField",
        "TextField",
    }
)


@dataclass(frozen=True)
class _Stored:
    """How a model's INSERT stores a row: its fields, and for each, whether its value needs its
    field's get_db_prep_save."""

    fields: tuple[Field[Any, Any], ...]
    prepared: tuple[bool, ...]


_STORED: dict[type[Model], _Stored] = {}


def _stored(model: type[Model]) -> _Stored:
    """The columns an INSERT of `model` writes: every concrete field but an auto primary key and
    a generated column (the ORM's own choice in `Model._save_table`)."""
    stored = _STORED.get(model)
    if stored is None:
        meta = model._meta
        fields = tuple(
            f
            for f in meta.local_concrete_fields
            if f is not meta.auto_field and not getattr(f, "generated", False)
        )
        if any(hasattr(f, "get_placeholder") for f in fields):
            # Its placeholder is not %s (e.g. a BinaryField's): not written out here.
            raise TypeError(f"{model.__name__} has a field these written-out INSERTs cannot store")
        prepared = tuple(
            getattr(f, "target_field", f).get_internal_type() not in _AS_IS for f in fields
        )
        stored = _STORED[model] = _Stored(fields, prepared)
    return stored


def _row(db: BaseDatabaseWrapper, obj: Model) -> list[Any]:
    """`obj`'s values as its INSERT stores them (a UUID as hex on SQLite, JSON as JSON,
    datetimes as the backend adapts them)."""
    stored = _stored(type(obj))
    return [
        field.get_db_prep_save(getattr(obj, field.attname), db)
        if prepared
        else getattr(obj, field.attname)
        for field, prepared in zip(stored.fields, stored.prepared, strict=True)
    ]


def _insert_sql(model: type[Model], *returning: str) -> Builder:
    """A builder of `model`'s INSERT, returning the columns named (quoted) and the scalar
    subqueries given (an item starting with "(")."""

    def build(q: Callable[[str], str]) -> str:
        fields = _stored(model).fields
        columns = ", ".join(q(_column(f)) for f in fields)
        values = ", ".join(["%s"] * len(fields))
        sql = f"INSERT INTO {q(model._meta.db_table)} ({columns}) VALUES ({values})"
        if not returning:
            return sql
        items = ", ".join(item if item.startswith("(") else q(item) for item in returning)
        return f"{sql} RETURNING {items}"

    return build


def _saved(db: BaseDatabaseWrapper, obj: Model) -> None:
    """Mark an instance inserted here as the ORM marks what it saved."""
    obj._state.adding = False
    obj._state.db = db.alias


def insert_message(
    db: BaseDatabaseWrapper, message: Message, *, instructions_of: int | None = None
) -> str | None:
    """INSERT a new message (its `created_at` taken now, as the ORM's `auto_now_add` does) and
    set its id. With `instructions_of` (a user id), the same statement reads that user's
    custom instructions and returns them (None: none set), where the database can return
    columns from an INSERT (PostgreSQL; SQLite from 3.35); else a second statement does."""
    message.created_at = timezone.now()
    params = _row(db, message)
    returning = db.features.can_return_columns_from_insert
    with db.cursor() as cursor:
        if returning and instructions_of is not None:
            build = _insert_sql(Message, "id", instructions_subquery(db))
            cursor.execute(_sql(db, "message+instructions", build), [*params, instructions_of])
            message.pk, instructions = cursor.fetchone()
            _saved(db, message)
            return instructions
        if returning:
            cursor.execute(_sql(db, "message+id", _insert_sql(Message, "id")), params)
            message.pk = cursor.fetchone()[0]
        else:
            cursor.execute(_sql(db, "message", _insert_sql(Message)), params)
            message.pk = db.ops.last_insert_id(cursor, Message._meta.db_table, "id")
    _saved(db, message)
    return None if instructions_of is None else custom_instructions(instructions_of)


def insert_conversation(db: BaseDatabaseWrapper, conversation: Conversation) -> None:
    """INSERT a new conversation as it stands (its times set by the caller)."""
    with db.cursor() as cursor:
        cursor.execute(_sql(db, "conversation", _insert_sql(Conversation)), _row(db, conversation))
    _saved(db, conversation)


def set_leaf(
    db: BaseDatabaseWrapper, conversation: Conversation, leaf: Message, *, model: str | None = None
) -> None:
    """The conversation's branch now ends at `leaf` (and, with `model`, that model is its
    pick): one UPDATE, `updated_at` now as `auto_now` would."""
    now = timezone.now()
    meta = Conversation._meta
    sets = ["leaf", "updated_at"] + (["model"] if model is not None else [])

    def build(q: Callable[[str], str]) -> str:
        assignments = ", ".join(f"{q(_column(meta.get_field(name)))} = %s" for name in sets)
        return f"UPDATE {q(meta.db_table)} SET {assignments} WHERE {q(_column(meta.pk))} = %s"

    params: list[Any] = [leaf.pk, db.ops.adapt_datetimefield_value(now)]
    if model is not None:
        params.append(model)
    params.append(meta.pk.get_db_prep_value(conversation.pk, db))
    with db.cursor() as cursor:
        cursor.execute(_sql(db, "leaf+model" if model is not None else "leaf", build), params)
    conversation.updated_at = now


def conversation_of_turn(
    db: BaseDatabaseWrapper, user_id: int, conversation_id: Any
) -> tuple[Conversation, str | None] | None:
    """`check_conversation` and the user's custom instructions, in one statement (None: not
    a conversation of this user's, whether unknown, someone else's or not even a UUID, so ids
    cannot be probed).

    Where the database has row locks (PostgreSQL) the conversation's row is locked until the
    turn's transaction ends: two turns of one conversation started at once (two tabs on two
    daphne instances) would otherwise both read the same leaf as their prompt's parent and fork
    it; the second now waits and reads the leaf the first set, so it chains after it. SQLite
    serialises writers and has no FOR UPDATE."""
    meta = Conversation._meta
    try:
        key = meta.pk.get_db_prep_value(str(conversation_id), db)
    except (ValidationError, ValueError):
        return None  # not a UUID: the same answer as unknown or someone else's

    def build(q: Callable[[str], str]) -> str:
        columns = ", ".join(f"c.{q(_column(f))}" for f in meta.concrete_fields)
        user = q(_column(meta.get_field("user")))
        # Only the conversation's row: the instructions' subquery reads without a lock.
        lock = " FOR UPDATE" if db.features.has_select_for_update else ""
        return (
            f"SELECT {columns}, {instructions_subquery(db)} FROM {q(meta.db_table)} c "
            f"WHERE c.{q(_column(meta.pk))} = %s AND c.{user} = %s{lock}"
        )

    with db.cursor() as cursor:
        cursor.execute(_sql(db, "turn conversation", build), (user_id, key, user_id))
        row = cursor.fetchone()
    if row is None:
        return None
    return _from_db(db, Conversation, row[:-1]), row[-1]


# Per connection (their backend's converters are its own methods) and model: the converters the
# ORM applies to each column it reads (SQLite's text datetimes and UUIDs, its integer booleans).
_CONVERTERS: WeakKeyDictionary[BaseDatabaseWrapper, dict[type[Model], list[Any]]] = (
    WeakKeyDictionary()
)


def _from_db(db: BaseDatabaseWrapper, model: type[Model], values: Sequence[Any]) -> Any:
    """An instance from a row of all its concrete columns, converted as the ORM converts them."""
    by_model = _CONVERTERS.setdefault(db, {})
    converters = by_model.get(model)
    if converters is None:
        fields = model._meta.concrete_fields
        columns = [f.get_col(model._meta.db_table) for f in fields]
        converters = by_model[model] = [
            (col, db.ops.get_db_converters(col) + f.get_db_converters(db))
            for f, col in zip(fields, columns, strict=True)
        ]
    converted = list(values)
    for i, (column, functions) in enumerate(converters):
        for convert in functions:
            converted[i] = convert(converted[i], column, db)
    return model.from_db(db.alias, [f.attname for f in model._meta.concrete_fields], converted)


def _column(field: Any) -> str:
    """A concrete field's column (every field these statements name has one)."""
    column = field.column
    if not isinstance(column, str):
        raise TypeError(f"{field} has no column")
    return column


# What a turn's end writes on its answer's row (with `lease_until` NULL and `finished_at` now).
_FINISHED = (
    "text",
    "html",
    "status",
    "error",
    "chunk_count",
    "prompt_tokens",
    "completion_tokens",
    "usage_estimated",
    "ttft_ms",
)


def finish_answer(db: BaseDatabaseWrapper, mid: str, values: dict[str, Any]) -> Message | None:
    """Write a finished answer's row (`values`: each of _FINISHED, as stored) and read it back
    whole for its final frame and `done`: one UPDATE … RETURNING where the database can return
    columns (PostgreSQL; SQLite from 3.35, as for an INSERT's), else an UPDATE then a SELECT.
    None when no row has that mid (the conversation was deleted while the answer streamed)."""
    meta = Message._meta
    now = timezone.now()
    params = [values[name] for name in _FINISHED]
    params += [None, db.ops.adapt_datetimefield_value(now), mid]
    returning = db.features.can_return_columns_from_insert

    def build(q: Callable[[str], str]) -> str:
        sets = ", ".join(
            f"{q(_column(meta.get_field(name)))} = %s"
            for name in (*_FINISHED, "lease_until", "finished_at")
        )
        sql = f"UPDATE {q(meta.db_table)} SET {sets} WHERE {q('mid')} = %s"
        if not returning:
            return sql
        return f"{sql} RETURNING {', '.join(q(_column(f)) for f in meta.concrete_fields)}"

    with db.cursor() as cursor:
        cursor.execute(_sql(db, "finish" if returning else "finish, no returning", build), params)
        if returning:
            row = cursor.fetchone()
        elif cursor.rowcount:
            columns = ", ".join(db.ops.quote_name(_column(f)) for f in meta.concrete_fields)
            table, key = db.ops.quote_name(meta.db_table), db.ops.quote_name("mid")
            cursor.execute(f"SELECT {columns} FROM {table} WHERE {key} = %s", [mid])
            row = cursor.fetchone()  # None: deleted between the two
        else:
            row = None
    return None if row is None else _from_db(db, Message, row)
