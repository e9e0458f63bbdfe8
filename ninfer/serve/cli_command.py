"""The click classes behind `ninfer`: options listed in vLLM's help groups, `--debug`, and the one error layer.

An expected failure (a `NinferError`) never reaches the user as a traceback: it is printed as
``error: <what> (<where>)`` plus a ``hint:`` line, and the process exits with the error's documented `ExitCode`.
Anything else is a bug and says so in one line too. ``--debug`` (any command) or ``NINFER_DEBUG=1`` lets the
exception through with its traceback. Kept free of heavy imports: `ninfer --help` must stay instant.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import click

from ninfer.errors import ExitCode, NinferError, UnavailableError, one_line, render

# vLLM's help groups, in its order; the ninfer-only flags last.
HELP_GROUPS = ("ModelConfig", "CacheConfig", "ParallelConfig", "SchedulerConfig", "SpeculativeConfig",
               "MultiModalConfig", "Frontend", "Sampling", "ninfer")
DEBUG_ENV = "NINFER_DEBUG"


class GroupedOption(click.Option):
    """An option that knows its help group (``help_group="CacheConfig"``)."""

    def __init__(self, *args: Any, help_group: str = "Options", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.help_group = help_group


def grouped_option(*decls: str, env: str, group: str, **kw: Any) -> Callable:
    """A click option listed under `group` in --help, also read from the variable NINFER_<env>."""
    return click.option(*decls, cls=GroupedOption, help_group=group, envvar=f"NINFER_{env}", show_envvar=True, **kw)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta["ninfer.debug"] = True


DEBUG_OPTION = GroupedOption(["--debug"], is_flag=True, expose_value=False, is_eager=True, envvar=DEBUG_ENV,
                             show_envvar=True, callback=_set_debug, help_group="ninfer",
                             help="Show the full traceback of an error instead of one line.")


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.meta.get("ninfer.debug")) or os.environ.get(DEBUG_ENV, "") not in ("", "0", "false")


class NinferCommand(click.Command):
    """A command whose options are listed by help group and that takes `--debug`."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return [*super().get_params(ctx), DEBUG_OPTION]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):
                groups.setdefault(getattr(param, "help_group", "Options"), []).append(record)
        order = [g for g in HELP_GROUPS if g in groups] + [g for g in groups if g not in HELP_GROUPS]
        for name in order:
            with formatter.section(name):
                formatter.write_dl(groups[name])


class NinferGroup(click.Group):
    """The `ninfer` group: subcommands are NinferCommands; the top-level invocation renders errors."""

    command_class = NinferCommand
    group_class = type

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return [*super().get_params(ctx), DEBUG_OPTION]

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.parent is not None:
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort, KeyboardInterrupt, EOFError):
            raise
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            _fail([f"error: {e.format_message()}", f"hint: see '{where} --help'"], e.exit_code)
        except click.ClickException as e:
            _fail([f"error: {one_line(e.format_message())}"], e.exit_code)
        except NinferError as e:
            if _debug(ctx):
                raise
            _fail(render(e), e.exit_code)
        except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback under --debug
            if _debug(ctx):
                raise
            _fail([f"error: internal error: {type(e).__name__}: {e}",
                   f"hint: this is a bug in ninfer; rerun with --debug (or {DEBUG_ENV}=1) for the traceback"],
                  ExitCode.INTERNAL)


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Imports of an optional extra's packages: a missing one is an expected failure naming the install line."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise UnavailableError(f"this command needs the {e.name!r} package").locate(
            f"the [{extra}] extra", hint=f"pip install -e '.[{extra}]'") from None


def _fail(lines: list[str], code: int) -> None:
    for line in lines:
        click.echo(line, err=True)
    sys.exit(int(code))
