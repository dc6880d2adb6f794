"""The surface a rule is written against: everything a rule file imports from ckptlint.

A rule sees three things, and nothing else of the linter:

- **the file it checks**, as a ``FileContext``: the parsed ``module`` (its tree, text, lines
  and scopes), and ``finding()`` to report a node with flake8's columns;
- **the project analysis**, ``context.analysis`` (``ProjectAnalysis``): the region sites of
  a module and the values each region runs (``sites``, ``region``, ``effective_paths``,
  ``reentrancy``, ``holds_parameters``), what a region reaches (``reach``, ``near_reach``,
  ``reach_of``, ``changes_of``), the selective-checkpoint ``policies``, and the evaluator's
  answers (``evaluate``, ``member``, ``iterate``, ``bind``, ``scope_of``, ``binding_values``,
  ``argument_values``, ``mro``, ``instance_assignments``, ``versions_at``, ``calls_at``,
  ``paths``, ``keyword``, ``nodes_with_scopes``). Its ``evaluator``, ``finder``,
  ``reaches`` and ``changes`` are the machinery behind those answers, not for rules;
- **the names re-exported below**: the values the analysis answers with, the region, policy
  and effect records, the syntax helpers the layers share, what torch's names mean, and the
  findings and fixes a rule returns.

So a rule file imports from ckptlint only this module (``tests/test_rule_surface.py``
enforces it). Knowledge only one rule needs lives in that rule's file; a query or record a
second rule needs moves down into its layer (project -> resolution -> regions -> effects)
and is re-exported here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import ClassVar

from ckptlint.analysis import ProjectAnalysis
from ckptlint.core import AddKeyword, Applicability, BindNames, Finding, Fix, ReplaceText
from ckptlint.effects.reach import (
    GlobalWrite,
    Location,
    Reach,
    assigned_targets,
    header_nodes,
    root_name,
)
from ckptlint.project.index import Module
from ckptlint.project.scopes import (
    COMPREHENSIONS,
    FUNCTIONS,
    Binding,
    Scope,
    nested_bodies,
    node_position,
    statements_at,
)
from ckptlint.regions.policies import CHECKPOINT_POLICY, Policy
from ckptlint.regions.sites import Site, SourceCall, callee_label
from ckptlint.regions.sources import (
    CHECKPOINT,
    CHECKPOINT_SEQUENTIAL,
    CHECKPOINT_WRAPPER,
    CHECKPOINT_WRAPPERS,
    ReentrantArgument,
)
from ckptlint.regions.steps import Loop, loops_around, runs_backward
from ckptlint.resolution.bodies import own_nodes
from ckptlint.resolution.calls import PARTIAL
from ckptlint.resolution.mappings import ABSENT, Absent, Given, Passed, Unknown, with_default
from ckptlint.resolution.values import (
    UNKNOWN,
    Argument,
    Arguments,
    ClassValue,
    Constant,
    Context,
    Elements,
    External,
    Flow,
    FunctionValue,
    Instance,
    Mapping,
    Parameter,
    PartialValue,
    Sequence,
    Value,
    Values,
    known,
)
from ckptlint.resolution.versions import VersionRange
from ckptlint.torch_catalogue import (
    MUTATING_METHODS,
    SEQUENTIAL_CONTAINERS,
    canonical,
    is_torch_module_class,
    short_name,
)

__all__ = [
    # the file and the rule
    "FileContext",
    "Rule",
    "Module",
    # the project analysis
    "ProjectAnalysis",
    # values the analysis answers with (resolution.values, resolution.versions)
    "UNKNOWN",
    "Argument",
    "Arguments",
    "ClassValue",
    "Constant",
    "Context",
    "Elements",
    "External",
    "Flow",
    "FunctionValue",
    "Instance",
    "Mapping",
    "Parameter",
    "PartialValue",
    "Sequence",
    "Value",
    "Values",
    "VersionRange",
    "known",
    # what a mapping holds under a key (resolution.mappings)
    "ABSENT",
    "Absent",
    "Given",
    "Passed",
    "Unknown",
    "with_default",
    # regions: sites, their source calls, the sources' names, policies, training steps
    "Site",
    "SourceCall",
    "ReentrantArgument",
    "CHECKPOINT",
    "CHECKPOINT_SEQUENTIAL",
    "CHECKPOINT_WRAPPER",
    "CHECKPOINT_WRAPPERS",
    "CHECKPOINT_POLICY",
    "PARTIAL",
    "Policy",
    "Loop",
    "loops_around",
    "runs_backward",
    # effects: what a region reaches
    "GlobalWrite",
    "Location",
    "Reach",
    # syntax helpers the layers share
    "Binding",
    "Scope",
    "COMPREHENSIONS",
    "FUNCTIONS",
    "assigned_targets",
    "callee_label",
    "header_nodes",
    "nested_bodies",
    "node_position",
    "own_nodes",
    "root_name",
    "statements_at",
    # what torch's names mean
    "MUTATING_METHODS",
    "SEQUENTIAL_CONTAINERS",
    "canonical",
    "is_torch_module_class",
    "short_name",
    # what a rule returns
    "AddKeyword",
    "BindNames",
    "Finding",
    "Fix",
    "ReplaceText",
]


class FileContext:
    """The module a rule checks, and the project analysis it may ask about it."""

    def __init__(self, module: Module, analysis: ProjectAnalysis) -> None:
        self.module = module
        self.lines = module.lines
        self.analysis = analysis

    def character_column(self, line: int, byte_offset: int) -> int:
        """ast columns are UTF-8 byte offsets; report characters, 1-based, like flake8 does."""
        if 0 < line <= len(self.lines):
            text = self.lines[line - 1]
            if not text.isascii():
                return len(text.encode()[:byte_offset].decode(errors="replace")) + 1
        return byte_offset + 1

    def finding(self, node: ast.AST, code: str, message: str, fix: Fix | None = None) -> Finding:
        """A finding spanning ``node``; for a ``def``, its header up to the name."""
        line, column = node.lineno, node.col_offset  # type: ignore[attr-defined]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end_line = line
            end_offset = self.lines[line - 1].encode().find(node.name.encode(), column)
            end_offset = column if end_offset < 0 else end_offset + len(node.name.encode())
        else:
            end_line, end_offset = node.end_lineno or line, node.end_col_offset or 0  # type: ignore[attr-defined]
        return Finding(
            line=line,
            column=self.character_column(line, column),
            code=code,
            message=message,
            end_line=end_line,
            end_column=self.character_column(end_line, end_offset),
            fix=fix,
        )


class Rule:
    """Base of every rule. The subclass docstring is what ``ckptlint --explain`` prints.

    ``EXAMPLE`` and ``CORRECTED`` are the whole modules ``--explain`` and docs/rules.md show:
    code that is reported and the same code written correctly. ``EXAMPLE`` marks each
    finding with an ``# expect: CODE@COLUMN`` comment on its line (left out where it is
    shown); the tests check both against the CLI and flake8 exactly, with every other case
    of the rule, in tests/fixtures/rules/<code>/ (see its README.md).
    """

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    # Identifiers that make a file worth analysing for this rule wherever they appear, also
    # in a file whose text names no region source (a trainer building DDP).
    TRIGGERS: ClassVar[frozenset[str]] = frozenset()
    # What ckptguard does about the same bug at run time (``--explain`` prints it).
    GUARD: ClassVar[str | None] = None
    # The fix its findings can carry: "safe", "unsafe" (applied with --unsafe-fixes), or None.
    FIX: ClassVar[Applicability | None] = None
    EXAMPLE: ClassVar[str]
    CORRECTED: ClassVar[str]

    def check(self, context: FileContext) -> Iterator[Finding]:
        raise NotImplementedError


_EXPECTATION = re.compile(r"[ \t]*# expect: .*$", re.MULTILINE)


def shown(example: str) -> str:
    """An example as users read it: without the ``# expect:`` comments the tests read."""
    return _EXPECTATION.sub("", example)
