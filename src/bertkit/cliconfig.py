"""Command-line options generated from a typed dataclass: the flag, the YAML key and the attribute
are one name.

    add_options(parser, FinetuneConfig)          # --batch_size (also --batch-size), --packed/--no-packed, ...
    suggest_unknown(parser)                      # '--batchsize' -> "did you mean --batch_size?"
    values = given(args, FinetuneConfig)         # only the options on the command line
    cfg = from_dict(FinetuneConfig, {**yaml_mapping, **values}, source)     # bertkit.runconfig

One option per field, named like the attribute; the kebab spelling (`--batch-size`) works too, and a
one-letter field is a short option too (`-n`). A field without a default is a required option, a
`tuple[str, ...]` field takes one or more values, and `Annotated[str, POSITIONAL]` is an argument
(the command's input files: `bertkit predict IN.jsonl --model DIR`).
Help is the field's docstring (the string literal right after it in the class body), choices come
from `Literal[...]` annotations, bool fields are `--x/--no-x`, values are checked as `from_dict`
checks YAML values (`runconfig._coerce`). An option that is not given is absent from the namespace,
so YAML values are overridden only by what the user typed.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import sys
import textwrap
import types
import typing
from typing import Any, Iterable

from .runconfig import RunConfigError, _coerce, moved, yaml_value

POSITIONAL = "positional"
"""`Annotated[str, POSITIONAL]`: the field is a positional argument, optional where it has a default."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: its docstring, on one line} for a dataclass and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):          # no source (a frozen app): no help text
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _strip_optional(kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def literal_choices(kind: Any) -> tuple | None:
    """The values of a `Literal[...]` (or `Literal[...] | None`) annotation, else None."""
    kind = _strip_optional(kind)
    return typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None


def _converter(kind: Any, flag: str):
    """str -> the field's type, read as YAML and checked like a YAML value (a bad one is argparse's
    one-line error). A string option keeps the text as typed unless YAML reads it as a string (quotes
    taken off) or, for an optional key, as null ('null', '~'; blank text stays text): '123' stays '123',
    '"normal"' is 'normal'."""
    base = _strip_optional(kind)
    choices = literal_choices(kind)
    text_field = base is str or choices is not None and all(isinstance(c, str) for c in choices)

    def convert(text: str):
        value = yaml_value(text)
        if text_field and not (isinstance(value, str) or value is None and base is not kind and text.strip()):
            value = text
        try:
            return _coerce(value, kind, flag)
        except RunConfigError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{flag}: ")) from None
    convert.__name__ = getattr(base, "__name__", "value")     # argparse names it in "invalid int value"
    return convert


def _help(doc: str, default: Any, show_default: bool) -> str:
    if show_default and default is not None and default != "" and not isinstance(default, bool):
        doc = f"{doc} (default {default})" if doc else f"default {default}"
    return doc.replace("%", "%%")


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                names: Iterable[str] | None = None, exclude: Iterable[str] = (), show_defaults: bool = True,
                help: dict[str, str] | None = None, defaults: bool = False,
                old: dict[str, str] | None = None, prefix: str = "", required: Iterable[str] = ()) -> list[str]:
    """One option per field of `cls` (those in `names`, else all but `exclude`); returns their names.
    An option is required where its field has no default or the command names it in `required`.
    A field that is itself a dataclass is a section: its fields become `--section.key` options (an
    argument group in --help). `help` replaces a field's docstring (by option name, 'section.key' in
    a section) where the command means something more specific. An option not given is absent from
    the namespace, or with `defaults` holds the field's default. A former flag - a key renamed in
    `runconfig.MOVED`, or one of `old`: '--masked_lm_prob': 'masking_config.mask_prob' (a field) or
    '--span': '--masking_config.mode=span' - is the one-line error "X is now Y", never taken silently."""
    hints, extras = typing.get_type_hints(cls), typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    chosen = [n for n in (names if names is not None else by_name) if n not in set(exclude)]
    for name in chosen:
        f, kind, key = by_name[name], hints[name], prefix + name
        if dataclasses.is_dataclass(_strip_optional(kind)):
            group = parser.add_argument_group(f"{key}.* ({docs[name]})" if docs.get(name) else f"{key}.*") \
                if isinstance(parser, argparse.ArgumentParser) else parser
            add_options(group, _strip_optional(kind), show_defaults=show_defaults, defaults=defaults,
                        prefix=key + ".", help=help)
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        flags = [f"-{key}"] * (len(key) == 1) + [f"--{key}"] + ([f"--{key.replace('_', '-')}"] if "_" in key else [])
        own = (help or {}).get(key)               # the command's own text says its default itself
        text = _help(own or docs.get(name, ""), default, show_defaults and own is None)
        common = {"dest": key, "default": default if defaults else argparse.SUPPRESS}
        needed = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING or name in required
        if typing.get_origin(kind) is tuple and typing.get_args(kind)[1:] == (Ellipsis,):   # one or more (a list)
            kind, common["nargs"] = typing.get_args(kind)[0], "+" if needed else "*"
        if POSITIONAL in getattr(extras[name], "__metadata__", ()):     # the text as typed, no YAML reading
            parser.add_argument(key, nargs=common.get("nargs") or (None if needed else "?"), help=text,
                                default=default)
            continue
        common["required"] = needed
        if _strip_optional(kind) is bool:
            flags += [f"--no-{key}"] + ([f"--no-{key.replace('_', '-')}"] if "_" in key else [])
            parser.add_argument(*flags, action=_Switch, help=text, **common)
            continue
        choices = literal_choices(kind)
        parser.add_argument(*flags, help=text, type=_converter(kind, f"--{key}"), choices=choices,
                            metavar="{" + ",".join(map(str, choices)) + "}" if choices else name.upper(), **common)
    if not prefix:                                      # runconfig.MOVED's renamed keys, and `old`
        add_moved(parser, {f"--{k}": v for k, v in moved(cls).items()} | (old or {}))
    return chosen


def add_moved(parser: argparse.ArgumentParser | argparse._ArgumentGroup, old: dict[str, str]) -> None:
    """Former flags ({'--whole_word': '--mask_mode=whole_word'}, or a field's key as the value), in
    both spellings: given, each is the one-line error "X is now Y"."""
    for former, new in old.items():
        spellings = [former] + ([former.replace("_", "-")] if "_" in former else [])
        if any(sp in parser._option_string_actions for sp in spellings):   # named by another config of the command
            continue
        parser.add_argument(*spellings, action=_Moved, nargs="?", help=argparse.SUPPRESS,
                            default=argparse.SUPPRESS, dest=new if new.startswith("--") else "--" + new)


class _Moved(argparse.Action):
    """A former flag (its value, if any, is not read): the one-line error naming what replaced it."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.dest}")


def add_gone(parser: argparse.ArgumentParser, gone: dict[str, str]) -> None:
    """Former flags with no replacement ({'--opset': 'why'}): given, each is the one-line error
    "X is gone: why"."""
    for former, why in gone.items():
        parser.add_argument(former, action=_Gone, nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS,
                            dest=why)


class _Gone(_Moved):
    """A former flag with no replacement (its value, if any, is not read): the one-line error saying
    why; like `_Moved`, never suggested for a typo."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is gone: {self.dest}")


class _Switch(argparse.Action):
    """--x / --no-x (and their kebab spellings), shown as `--x | --no-x`. `--x=false` (a YAML
    boolean, as config keys are written) is rewritten to --no-x before parsing (`suggest_unknown`)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no-"))

    def format_usage(self) -> str:
        yes = self.option_strings[0]
        return f"{yes} | --no-{yes[2:]}"


def _switch_values(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """'--x=false' -> '--no-x', '--x=true' -> '--x' for switch options (the value read as a YAML
    boolean, as in a config file); other arguments unchanged."""
    out = []
    for a in args:
        flag, eq, value = a.partition("=")
        action = parser._option_string_actions.get(flag) if eq and a.startswith("--") else None
        if isinstance(action, _Switch) and not flag.startswith("--no-"):
            try:
                on = _coerce(yaml_value(value), bool, flag)
            except RunConfigError as e:
                parser.error(f"argument {e}")
            a = flag if on else "--no-" + flag[2:]
        out.append(a)
    return out


def _spellings(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """'--report_only' -> '--report-only', '--batch-size' -> '--batch_size': an option is taken in
    either spelling whoever wrote it (a field's, or an `add_argument` of a command); '--' ends options."""
    known, out = parser._option_string_actions, []
    for i, a in enumerate(args):
        if a == "--":
            return out + args[i:]
        flag, eq, value = a.partition("=")
        if a.startswith("--") and flag not in known:
            others = ("--" + flag[2:].replace("_", "-"), "--" + flag[2:].replace("-", "_"))
            a = next((other + eq + value for other in others if other in known), a)
        out.append(a)
    return out


def given(args: argparse.Namespace, cls: type, prefix: str = "") -> dict:
    """{field: value} of the options of `cls` given on the command line; a section's as a nested dict."""
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(_strip_optional(hints[f.name])):
            if section := given(args, _strip_optional(hints[f.name]), key + "."):
                out[f.name] = section
        elif hasattr(args, key):
            out[f.name] = getattr(args, key)
    return out


def suggest_unknown(parser: argparse.ArgumentParser) -> None:
    """An unknown option is argparse's one-line error plus the closest known option; `--x=false`
    works for a switch, and `--a_b` / `--a-b` are one option. Abbreviations are off: '--train.max_step'
    is a typo to name, not a prefix of --train.max_steps to guess."""
    parser.allow_abbrev = False
    plain = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = _switch_values(parser, _spellings(parser, list(sys.argv[1:] if args is None else args)))
        ns, extras = plain(args, namespace)
        if unknown := [a.split("=", 1)[0] for a in extras if a.startswith("-") and a not in ("-", "--")]:
            known = [s for s, a in parser._option_string_actions.items() if s.startswith("--")
                     and not isinstance(a, _Moved)]
            close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
            parser.error(f"unrecognized arguments: {' '.join(extras)}"
                         + (f" (did you mean {close[0]}?)" if close else ""))
        return ns, extras
    parser.parse_known_args = parse_known_args
