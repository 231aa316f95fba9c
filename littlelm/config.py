"""Config machinery: YAML with `include:`, dotted overrides, validation that reports every problem.

The flow is

    tree, origin = load_tree("run.yaml")              # includes merged, origin[key] = file
    apply_overrides(tree, origin, ["train.max_steps=100"])
    cfg = validate(RunConfig, tree, origin)            # typed, every default filled in

`validate` walks a pydantic model. A field marked `Kind("optimizer")` holds a component chosen by
name (`optimizer: {name: adamw, lr: 0.001}`), or a list or mapping of them: its type is the
component's config class or a union of them discriminated on `name` (`AdamWConfig | MuonConfig`),
each class beside the code it builds (`cfg.build(...)`). Its section is validated against the
class it names; an open set (the trainer's callbacks, added from layers above the schema) names a
`table` instead. All problems found anywhere are raised together as one ConfigError, each naming
its dotted key, the file that set it and a did-you-mean for misspelled keys and names.

Nothing here knows about models or training: the run's schema lives in `littlelm.schema`.
"""

from __future__ import annotations

import copy
import math
import re
import reprlib
import types
import typing
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

from littlelm.errors import ConfigError, did_you_mean

CLI = "command line"

# Markers for a field's json_schema_extra, read by `marked`:
# a resumed run may change it (a section marked so covers its keys; train/checkpoint/resume.py);
RESUMABLE: JsonDict = {"resumable": True}
# ... and it does not change which tokens the data loader yields next (grow.continue_data).
SAME_DATA: JsonDict = {"resumable": True, "same_data": True}


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `3e-4` and `1e6` as floats (YAML 1.2), not strings, and
    refuses a key given twice in one mapping."""

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        seen: dict[str, int] = {}
        for key, _ in node.value:  # checked before merge keys (`<<`) are flattened in
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            line = key.start_mark.line + 1
            if key.value in seen:
                raise DuplicateKeyError(short(key.value), seen[key.value], line)
            seen[key.value] = line
        return node


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


MAX_NODES = 1_000_000  # a config has hundreds of values; aliases may not expand it past this


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one mapping (YAML would silently keep the last)."""

    def __init__(self, key: str, first: int, second: int):
        self.key, self.first, self.second = key, first, second
        super().__init__(f"duplicate key {key!r} at lines {first} and {second}")


class AliasBombError(yaml.YAMLError):
    """Aliases (`*name`) that expand to more than MAX_NODES values ("billion laughs")."""


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Values in `node` once every alias is expanded (shared nodes are counted once each time
    they are used, but computed once, so this is linear in the document's size)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a recursive alias counts once (SafeLoader builds it as a cycle)
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(n, memo) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = size
    return size


def parse_yaml(text: str):
    """YAML text -> data, refusing duplicate keys and aliases that expand past MAX_NODES."""
    loader = _Loader(text)  # a SafeLoader subclass: no arbitrary objects
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise AliasBombError(
                f"its aliases (*name) expand to more than {MAX_NODES:,} values; a run file "
                "needs far fewer: write the values out"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlevel = 80, 80, 3
_short.maxlist = _short.maxdict = _short.maxtuple = _short.maxset = 6


def short(value: Any) -> str:
    """repr(value), cut to about 80 characters per string and 6 items per container (a value
    quoted in an error message can be huge)."""
    return _short.repr(value)


class Cfg(BaseModel):
    """Base of every config section: unknown keys are errors, values are checked strictly."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class ComponentConfig(Cfg):
    """Base of a component's config: `name` (a Literal in each concrete class) picks the class
    among those its field offers; each kind's base declares how its configs build their
    component (`SourceConfig.build(label)`, `OptimizerConfig.build(model, ...)`, ...)."""

    name: str = pydantic.Field("", description="Which component (littlelm list).")


def named(name: str, **extra: Any) -> Any:
    """The `name` field of a component's config class: `name: Literal["adamw"] = named("adamw")`
    (`extra`: its json_schema_extra markers)."""
    return pydantic.Field(
        name, description="Which component (littlelm list).", json_schema_extra=extra or None
    )


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, its lines joined (`littlelm list` shows it whole)."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\. ", paragraph)  # a full stop, not an "e.g."
    return paragraph[: end.start() + 1] if end else paragraph


@dataclass(frozen=True)
class Kind:
    """Field marker: the field holds a component of this kind (or a list or mapping of them),
    one of the config classes of its type; `table`, for an open set, gives them instead."""

    kind: str
    table: Callable[[], dict[str, type[ComponentConfig]]] | None = None


@dataclass(frozen=True)
class Slot:
    """A component field, read from its type: the classes it offers by name, the one used when
    the section names none, and whether it holds one component, a list or a mapping."""

    kind: str
    classes: dict[str, type[ComponentConfig]]
    default: str | None
    container: str | None  # None: one component; "list" or "dict": several

    def names(self) -> list[str]:
        return sorted(self.classes)


def component_name(cls: type[ComponentConfig]) -> str:
    return str(cls.model_fields["name"].default)


def offered(annotation: Any) -> tuple[type[ComponentConfig], ...]:
    """The config classes of a union type (or the one class) of components."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    return tuple(m for m in members if isinstance(m, type) and issubclass(m, ComponentConfig))


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def slot(field: FieldInfo) -> Slot | None:
    """The component slot of a field marked `Kind`, None for any other field."""
    kind = next((m for m in field.metadata if isinstance(m, Kind)), None)
    if kind is None:
        return None
    ann: Any = field.annotation
    # X | None (a section that may be null) offers X; list[X] and dict[str, X] hold several
    args = [a for a in typing.get_args(ann) if a is not type(None)] if _is_union(ann) else [ann]
    container: str | None = None
    if len(args) == 1 and typing.get_origin(args[0]) in (list, dict):
        container = "list" if typing.get_origin(args[0]) is list else "dict"
        args = [typing.get_args(args[0])[-1]]
    if kind.table is not None:
        classes = kind.table()
    else:
        classes = {component_name(c): c for a in args for c in offered(a)}
    default = field.get_default(call_default_factory=True)
    name = default.get("name") if isinstance(default, dict) else getattr(default, "name", None)
    return Slot(kind.kind, classes, name if container is None else None, container)


# ----------------------------------------------------------------------------------------------
# Loading and merging


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError([f"config file not found: {path}"])
    try:
        data = parse_yaml(path.read_text())
    except DuplicateKeyError as e:
        raise ConfigError(
            [
                f"{path}:{e.second}: duplicate key {e.key}, already set at line {e.first} (YAML "
                "would silently keep only the last one); merge the two into one"
            ]
        ) from None
    except AliasBombError as e:
        raise ConfigError([f"{path}: {e}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            [f"{where}: malformed YAML: {problem} (check indentation, colons and quotes there)"]
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{path}: a run file must be a mapping of sections, got {type(data).__name__}"]
        )
    return data


Components = dict[tuple[str, ...], "str | None"]  # a component section's path -> default name


def load_tree(
    path: str | Path,
    components: Components | None = None,
    packaged: Path | None = None,
    _seen: tuple[Path, ...] = (),
) -> tuple[dict, dict[str, str]]:
    """Read `path` and its includes; returns the merged tree and the file that set each key.

    `include:` takes a path or a list of paths relative to the including file, or the name of a
    packaged config (`include: [demo]`, a file of `packaged`). Included files are merged first,
    in order; the including file's own keys win over them, and a component section (a path in
    `components`, e.g. `data.tokenizer`) that names another component starts afresh.
    """
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError([f"include cycle: {chain}"])
    data = read_yaml(path)
    includes = data.pop("include", None) or []
    if isinstance(includes, str):
        includes = [includes]
    tree: dict = {}
    origin: dict[str, str] = {}
    for inc in includes:
        inc_path = _include_path(path, str(inc), packaged)
        sub, sub_origin = load_tree(inc_path, components, packaged, (*_seen, path))
        merge_into(tree, sub, origin, components or {})
        origin.update(sub_origin)
    merge_into(tree, data, origin, components or {})
    origin.update({k: str(path) for k in leaf_keys(data)})
    return tree, origin


def _include_path(including: Path, inc: str, packaged: Path | None) -> Path:
    """An include's file: relative to the including file, else a packaged config's name."""
    local = (including.parent / inc).resolve()
    if local.is_file():
        return local
    if packaged is not None:
        name = Path(inc) if Path(inc).suffix else Path(inc).with_suffix(".yaml")
        if (packaged / name).is_file():
            return packaged / name
        raise ConfigError(
            [
                f"{including}: include: file not found: {local} (nor a packaged config: "
                f"{packaged_names(packaged)})"
            ]
        )
    raise ConfigError([f"{including}: include: file not found: {local}"])


def packaged_names(packaged: Path) -> str:
    """The configs under `packaged` by the names `include:` and the CLI take: `demo, plans/x`."""
    return ", ".join(
        sorted(str(f.relative_to(packaged).with_suffix("")) for f in packaged.rglob("*.yaml"))
    )


def merge_into(
    base: dict, new: dict, origin: dict[str, str], components: Components, at: tuple[str, ...] = ()
) -> None:
    """Deep-merge `new` into `base`: mappings merge key by key, anything else replaces. A
    component section whose `name` changes is replaced whole, not merged: the old component's
    keys (a bpe tokenizer's vocab_size under `name: byte`) would not be the new one's, and their
    `origin` entries go with them."""
    for key, value in new.items():
        here = (*at, key)
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            if _renamed(components, here, old, value):
                _forget(origin, here)
                base[key] = copy.deepcopy(value)
            else:
                merge_into(old, value, origin, components, here)
        else:
            base[key] = copy.deepcopy(value)


def _component_default(components: Components, here: tuple[str, ...]) -> tuple[bool, str | None]:
    """(is `here` a component section, its default name); `*` in a path matches any label."""
    for pattern, default in components.items():
        if len(pattern) == len(here) and all(p in ("*", h) for p, h in zip(pattern, here)):
            return True, default
    return False, None


def _renamed(components: Components, here: tuple[str, ...], old: dict, new: dict) -> bool:
    is_component, default = _component_default(components, here)
    return is_component and "name" in new and new["name"] != old.get("name", default)


def _forget(origin: dict[str, str], here: tuple[str, ...], keep: str | None = None) -> None:
    """Drop the origin of every key under `here` (but those set by `keep`)."""
    prefix = ".".join(here) + "."
    for k in [k for k in origin if k.startswith(prefix) and origin[k] != keep]:
        del origin[k]


def component_paths(cls: type[BaseModel], at: tuple[str, ...] = ()) -> Components:
    """Where the sections of `cls` (a schema) hold a component picked by `name:`, with each
    one's default name: {("model",): "gpt", ("data", "sources", "*"): None, ...}."""
    out: Components = {}
    for key, meta in _slots(cls).items():
        here = (*at, key, "*") if meta.container == "dict" else (*at, key)
        if meta.container != "list":
            out[here] = meta.default
    for key, sub in _nested_models(cls).items():
        out.update(component_paths(sub, (*at, key)))
    return out


def leaf_keys(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(leaf_keys(value, dotted + "."))
        else:
            out.append(dotted)
    return out


def apply_overrides(
    tree: dict,
    origin: dict[str, str],
    overrides: Iterable[str],
    components: Components | None = None,
) -> None:
    """Apply `a.b.c=value` overrides in place; values are parsed as YAML (`true`, `3e-4`, `[1,2]`).

    `data.tokenizer.name=byte` over a bpe tokenizer starts that component's section afresh (a
    path in `components`): the keys the files set for the old component go; those set by earlier
    overrides stay."""
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(
                f"override {short(item)}: expected dotted.key=value, e.g. train.max_steps=100"
            )
            continue
        try:
            value = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        section = tuple(parts[:-1])
        if parts[-1] == "name" and _renamed(components or {}, section, node, {"name": value}):
            by_cli = _cli_keys(origin)
            for k in [k for k in node if ".".join((*section, k)) not in by_cli]:
                del node[k]  # the old component's keys, unless an earlier override set them
            _forget(origin, section, keep=CLI)
        node[parts[-1]] = value
        for stale in [k for k in origin if k == key or k.startswith(key + ".")]:
            del origin[stale]
        origin[key] = CLI
    if problems:
        raise ConfigError(problems)


def _cli_keys(origin: dict[str, str]) -> set[str]:
    """The keys set by overrides, and every section above them."""
    out: set[str] = set()
    for k, v in origin.items():
        if v == CLI:
            parts = k.split(".")
            out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return out


# ----------------------------------------------------------------------------------------------
# Validation


def validate(
    cls: type[Cfg], tree: dict, origin: dict[str, str] | None = None, source: str = ""
) -> Any:
    """Validate `tree` against `cls`; raise one ConfigError listing every problem. A schema
    with an `upgrade(tree, origin)` classmethod reads older layouts through it first (on copies;
    each of its notes is a warning)."""
    upgrade = getattr(cls, "upgrade", None)
    if upgrade is not None:
        tree, origin = copy.deepcopy(tree), dict(origin or {})
        for note in upgrade(tree, origin):
            warnings.warn(note, stacklevel=2)
    errors: list[tuple[tuple, str]] = []
    result = _validate_model(cls, tree, (), errors)
    if not errors:
        errors += _non_finite(result)
    if errors:
        origin = origin or {}
        raise ConfigError(
            [_describe(loc, msg, origin, source) for loc, msg in errors], source or None
        )
    return result


def _non_finite(cfg: Any) -> list[tuple[tuple, str]]:
    """inf and nan pass pydantic's float checks (and `gt=0`): no setting means them."""
    return [
        (tuple(key.split(".")), f"must be a finite number, got {value}")
        for key, value in flatten(to_tree(cfg)).items()
        if isinstance(value, float) and not math.isfinite(value)
    ]


def _slots(cls: type[BaseModel]) -> dict[str, Slot]:
    """The component fields of `cls` (marked `Kind`), by name."""
    return {name: s for name, f in cls.model_fields.items() if (s := slot(f)) is not None}


def _nested_models(cls: type[BaseModel]) -> dict[str, type[Cfg]]:
    """Fields whose type is itself a config model, possibly Optional: validated recursively so
    that their own component fields are handled too."""
    out: dict[str, type[Cfg]] = {}
    for name, field in cls.model_fields.items():
        ann = field.annotation
        candidates = typing.get_args(ann) or (ann,)
        for c in candidates:
            if isinstance(c, type) and issubclass(c, Cfg) and (_slots(c) or _nested_models(c)):
                out[name] = c
    return out


def _validate_model(cls: type[Cfg], data: Any, loc: tuple, errors: list) -> Any:
    if not isinstance(data, dict):
        errors.append((loc, f"expected a mapping, got {type(data).__name__} {short(data)}"))
        return None
    special: dict[str, Any] = {**_slots(cls), **_nested_models(cls)}
    plain = {k: v for k, v in data.items() if k not in special}
    placeholders = {k: cls.model_fields[k].get_default(call_default_factory=True) for k in special}
    try:
        instance = cls.model_validate({**plain, **placeholders})
    except pydantic.ValidationError as e:
        instance = None
        for err in e.errors():
            tag = ("name",) if err["type"] in UNION_TAG_ERRORS else ()  # the key that is wrong
            errors.append(((*loc, *err["loc"], *tag), _pydantic_message(err, cls, err["loc"])))
    for key, meta in special.items():
        default = cls.model_fields[key].get_default(call_default_factory=True)
        if isinstance(meta, Slot) and isinstance(default, ComponentConfig):
            default = {"name": default.name}  # an absent component: the default one, by name
        elif isinstance(default, BaseModel):  # an absent section: validate its defaults as data
            default = default.model_dump()
        value = data.get(key, default)
        if isinstance(meta, Slot):
            result = _validate_components(meta, value, (*loc, key), errors)
        elif value is None:
            result = None
        else:
            result = _validate_model(meta, value, (*loc, key), errors)
        if instance is not None:
            object.__setattr__(instance, key, result)
    return instance


def _validate_components(meta: Slot, value: Any, loc: tuple, errors: list) -> Any:
    if value is None:
        return None
    if meta.container == "list":
        if not isinstance(value, list):
            errors.append((loc, f"expected a list of {meta.kind}s, got {short(value)}"))
            return None
        return [_validate_component(meta, v, (*loc, i), errors) for i, v in enumerate(value)]
    if meta.container == "dict":
        if not isinstance(value, dict):
            errors.append((loc, f"expected a mapping of label -> {meta.kind}, got {short(value)}"))
            return None
        return {k: _validate_component(meta, v, (*loc, k), errors) for k, v in value.items()}
    return _validate_component(meta, value, loc, errors)


def _validate_component(meta: Slot, value: Any, loc: tuple, errors: list) -> Any:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        errors.append((loc, f"expected a mapping with 'name: <{meta.kind}>', got {short(value)}"))
        return None
    name = value.get("name", meta.default)
    if not isinstance(name, str) or name not in meta.classes:
        errors.append(((*loc, "name"), unknown_name(meta.kind, name, meta.names())))
        return None
    return _validate_model(meta.classes[name], {**value, "name": name}, loc, errors)


def unknown_name(kind: str, name: Any, known: list[str]) -> str:
    """The message for a component name that is none of `known`."""
    if name is None:
        return f"no {kind} named; known {kind}s: {', '.join(known)}"
    hint = did_you_mean(name, known) if isinstance(name, str) else ""
    # an empty list is an open table no one filled (littlelm/registry.py)
    names = ", ".join(known) or "none (littlelm.components.register_all() fills them; the CLI does)"
    return f"unknown {kind} {short(name)}{hint}; known {kind}s: {names}"


UNION_TAG_ERRORS = ("union_tag_invalid", "union_tag_not_found")


def _pydantic_message(err: Any, cls: type[BaseModel], rel_loc: tuple) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        owner = _owner_class(cls, rel_loc[:-1])
        fields = list(owner.model_fields) if owner else []
        key = str(rel_loc[-1])
        hint = did_you_mean(key, fields)
        known = f"; known keys: {', '.join(fields)}" if fields and not hint else ""
        return f"unknown key{hint}{known}"
    if kind == "missing":
        return "required key is missing"
    if kind in UNION_TAG_ERRORS:  # said as ours, not as pydantic's dump of the union
        ctx = err.get("ctx") or {}
        tags = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        return unknown_name("component", ctx.get("tag"), tags)
    msg = err["msg"]
    if "input" in err and not isinstance(err["input"], dict):
        msg += f", got {short(err['input'])}"
    return msg


def _owner_class(cls: type[BaseModel], rel_loc: tuple) -> type[BaseModel] | None:
    """The model class that owns the keys at `rel_loc` inside `cls` (for did-you-mean)."""
    current: Any = cls
    for part in rel_loc:
        if isinstance(part, int) or not (
            isinstance(current, type) and issubclass(current, BaseModel)
        ):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        args = typing.get_args(field.annotation) or (field.annotation,)
        current = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def dotted(loc: Iterable) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(loc: tuple, msg: str, origin: dict[str, str], source: str) -> str:
    key = dotted(loc)
    plain = ".".join(str(p) for p in loc)
    where = _origin_of(plain, origin) or source
    return f"{key} ({where}): {msg}" if where else f"{key}: {msg}"


def _origin_of(key: str, origin: dict[str, str]) -> str | None:
    while key:
        if key in origin:
            return origin[key]
        children = [v for k, v in origin.items() if k.startswith(key + ".")]
        if children:
            return children[0]
        key = key.rpartition(".")[0]
    return None


# ----------------------------------------------------------------------------------------------
# Field markers


def marked(cls: type[BaseModel], tree: dict, key: str, marker: str) -> bool:
    """Whether the dotted `key` (as `flatten` writes it: `data.sources.web.weight`,
    `callbacks[0].every`) of a config tree validated by `cls` is marked: the value of `marker`
    in the `json_schema_extra` of the innermost field on the key's path that sets it, so a
    marked section covers its keys unless one of them says otherwise. A component's keys are
    looked up in the config class of the component `tree` names there (when it names none:
    the field's default, else the base class all its classes share). False when no field on
    the path sets it."""
    found, node = False, tree
    owner: type[BaseModel] | None = cls
    parts: list[str | int] = [
        int(p) if p.isdigit() else p for p in re.split(r"\.|\[(\d+)\]\.?", key) if p
    ]
    while parts and owner is not None:
        part = parts.pop(0)
        field = owner.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            break
        extra = field.json_schema_extra
        if isinstance(extra, dict) and marker in extra:
            found = bool(extra[marker])
        node = _child(node, part)
        meta = slot(field)
        if meta is None:
            owner = _owner_class(owner, (part,))
            continue
        if meta.container and parts:  # step over the list index or the mapping's label
            node = _child(node, parts.pop(0))
        name = node.get("name", meta.default) if isinstance(node, dict) else node
        if isinstance(name, str) and name in meta.classes:
            owner = meta.classes[name]
        else:
            owner = _common_base(list(meta.classes.values()))
    return found


def _common_base(classes: list[type]) -> type[BaseModel] | None:
    """The most derived config class every one of `classes` derives from."""
    for base in classes[0].__mro__ if classes else ():
        if issubclass(base, BaseModel) and all(issubclass(c, base) for c in classes):
            return base
    return None


def _child(node: Any, part: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(str(part), node.get(part))
    if isinstance(node, list) and isinstance(part, int) and part < len(node):
        return node[part]
    return None


# ----------------------------------------------------------------------------------------------
# Dumping


def to_tree(cfg: Any) -> Any:
    """A validated config as plain data (dicts, lists, scalars), ready for YAML."""
    if isinstance(cfg, BaseModel):
        return {k: to_tree(getattr(cfg, k)) for k in type(cfg).model_fields}
    if isinstance(cfg, dict):
        return {k: to_tree(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_tree(v) for v in cfg]
    if isinstance(cfg, Path):
        return str(cfg)
    return cfg


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_tree(cfg), sort_keys=False, default_flow_style=None, width=100)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists of mappings use [i]."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(tree, list) and tree and all(isinstance(v, dict) for v in tree):
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = tree
    return out
