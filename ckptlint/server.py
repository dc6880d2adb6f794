"""``ckptlint server``: the language server editors run (LSP over standard input and output).

It asks the engine what the command line asks it, so a file's diagnostics are exactly what
``ckptlint FILE`` prints for it: each open file belongs to its project (found as the
command line finds it, with the project's configuration and cache and the options given to
``ckptlint server``), and the project's files are read from disk except the open ones,
whose unsaved text is linted instead. A finding often depends on another file (a global
changed in another module, a wrapper in a third), so every lint covers all the open files
of the project, and each whose diagnostics changed is published again.

Besides diagnostics: code actions for each finding's fix (titled as ruff titles them, the
unsafe ones marked), ``# noqa`` for the line, and "fix all" (safe fixes; unsafe ones too
with ``ckptlint server --unsafe-fixes``); hover on a finding or on a code in a ``# noqa``
comment shows the rule's documentation (what ``--explain`` prints); each diagnostic links
to the rule's section of docs/rules.md where the package sits in a clone.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from ckptlint import __version__
from ckptlint.add_noqa import WHOLE_FILE_CODES, add_noqa
from ckptlint.cli import Project, by_root, project_settings
from ckptlint.config import ConfigError
from ckptlint.core import AddKeyword, BindNames, Finding, Fix, ReplaceText
from ckptlint.memos import clear_memos
from ckptlint.noqa import NOQA
from ckptlint.source import split_lines

SOURCE = "ckptlint"
FIX_ALL = f"{types.CodeActionKind.SourceFixAll.value}.{SOURCE}"
# How long an edit waits for the next before the open files are linted: edits that arrive
# while a lint runs (typing in a large project) are linted once, together, not one by one.
SETTLE_SECONDS = 0.05
# What the editor is asked to watch (where it can be asked): the files that decide findings
# besides the open ones, so an edit outside the editor (git checkout, a configuration
# changed) is seen.
WATCHED = ("**/*.py", "**/pyproject.toml", "**/.gitignore", "**/.git/info/exclude")
# Where the rules are documented: docs/rules.md of the clone the package is installed from.
RULES_PAGE = Path(__file__).resolve().parent.parent / "docs" / "rules.md"


def serve(arguments: argparse.Namespace) -> int:
    """Run the server until the editor ends the session (``shutdown``, ``exit``)."""
    CheckpointServer(arguments).start_io()
    return 0


@dataclass(frozen=True)
class Linted:
    """A document's findings, for the text of one version of it."""

    version: int | None
    text: str
    findings: tuple[Finding, ...]


class CheckpointServer(LanguageServer):
    """The server; ``arguments`` are those of ``ckptlint server`` (``--select``,
    ``--config``, ``--unsafe-fixes``...), applied as the command line applies them."""

    def __init__(self, arguments: argparse.Namespace) -> None:
        super().__init__(
            SOURCE, __version__, text_document_sync_kind=types.TextDocumentSyncKind.Full
        )
        self.arguments = arguments
        self.linted: dict[str, Linted] = {}  # by URI: what each open document was linted as
        self.pending: set[str] | None = None  # a lint asked for (and these URIs to publish)
        self._timer: asyncio.TimerHandle | None = None
        self.shown_errors: set[str] = set()  # configuration errors shown and still standing
        self._register()

    def _register(self) -> None:
        @self.feature(types.INITIALIZED)
        def initialized(server: CheckpointServer, params: types.InitializedParams) -> None:
            server.watch_files()

        @self.feature(types.TEXT_DOCUMENT_DID_OPEN)
        def did_open(server: CheckpointServer, params: types.DidOpenTextDocumentParams) -> None:
            server.ask_lint({params.text_document.uri})

        @self.feature(types.TEXT_DOCUMENT_DID_CHANGE)
        def did_change(server: CheckpointServer, params: types.DidChangeTextDocumentParams) -> None:
            server.ask_lint({params.text_document.uri})

        @self.feature(types.TEXT_DOCUMENT_DID_SAVE)
        def did_save(server: CheckpointServer, params: types.DidSaveTextDocumentParams) -> None:
            server.ask_lint({params.text_document.uri})

        @self.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
        def files_changed(
            server: CheckpointServer, params: types.DidChangeWatchedFilesParams
        ) -> None:
            server.ask_lint()  # a file no editor holds changed on disk (or a configuration)

        @self.feature(types.TEXT_DOCUMENT_DID_CLOSE)
        def did_close(server: CheckpointServer, params: types.DidCloseTextDocumentParams) -> None:
            uri = params.text_document.uri
            server.linted.pop(uri, None)
            if server.pending is not None:
                server.pending.discard(uri)
            server.publish(uri, None, [])
            server.ask_lint()  # its saved text now stands for it

        @self.feature(
            types.TEXT_DOCUMENT_CODE_ACTION,
            types.CodeActionOptions(
                code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL],
                resolve_provider=False,
            ),
        )
        def code_action(
            server: CheckpointServer, params: types.CodeActionParams
        ) -> list[types.CodeAction]:
            server.lint_now()  # the findings of the text the editor holds now
            return server.code_actions(params)

        @self.feature(types.TEXT_DOCUMENT_HOVER)
        def hover(server: CheckpointServer, params: types.HoverParams) -> types.Hover | None:
            server.lint_now()
            return server.hover(params)

    def watch_files(self) -> None:
        """Ask the editor to say when the files that decide findings change on disk, where
        it lets a server ask (VS Code, Neovim and Helix do); else it says what it watches."""
        capabilities = self.client_capabilities.workspace
        watched = capabilities.did_change_watched_files if capabilities else None
        if watched is None or not watched.dynamic_registration:
            return
        options = types.DidChangeWatchedFilesRegistrationOptions(
            watchers=[types.FileSystemWatcher(glob_pattern=pattern) for pattern in WATCHED]
        )
        registration = types.Registration(
            id=f"{SOURCE}-watched-files",
            method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            register_options=options,
        )

        def answered(result: object) -> None:  # an editor that refuses: edits still lint
            pass

        self.client_register_capability(types.RegistrationParams([registration]), answered)

    # -- linting -----------------------------------------------------------------------------
    def ask_lint(self, publish: Iterable[str] = ()) -> None:
        """Lint the open files soon, publishing the diagnostics of ``publish`` (and of each
        whose findings change): edits that arrive before the lint starts join it, so a
        burst of edits is one lint, of the text the editor then holds."""
        if self.pending is None:
            self.pending = set()
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not serving (called directly): lint at once
                self.pending.update(publish)
                self.lint_now()
                return
            self._timer = loop.call_later(SETTLE_SECONDS, self.lint_now)
        self.pending.update(publish)

    def lint_now(self) -> None:
        """Run the lint asked for, if one is pending."""
        if self.pending is None:
            return
        publish, self.pending = self.pending, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.lint_open_documents(always=publish)

    def lint_open_documents(self, always: Iterable[str] = ()) -> None:
        """Lint every open file, as one run per project, and publish the diagnostics of
        those in ``always`` and of each whose findings changed."""
        documents = {
            path: document
            for document in self.workspace.text_documents.values()
            if (path := _path_of(document.uri)) is not None
        }
        linted: dict[str, Linted] = {}
        errors: list[str] = []
        for project in self._projects(list(documents), errors):
            for path, findings in self._lint_project(project, documents).items():
                document = documents[path]
                linted[document.uri] = Linted(document.version, document.source, findings)
        self._show_errors(errors)
        for uri, result in linted.items():
            previous = self.linted.get(uri)
            self.linted[uri] = result
            if uri in always or previous is None or previous.findings != result.findings:
                self.publish(uri, result.version, self.diagnostics(result))
        for document in documents.values():
            # Its project's configuration is wrong: no findings stand (they were for other
            # settings and text); the error is shown instead.
            if document.uri not in linted and self.linted.pop(document.uri, None) is not None:
                self.publish(document.uri, document.version, [])

    def _projects(self, paths: list[str], errors: list[str] | None = None) -> list[Project]:
        """The projects of ``paths``; one whose configuration is wrong is left out, and the
        error (as the command line prints it) added to ``errors``."""
        projects = []
        errors = [] if errors is None else errors
        try:
            for root, group in by_root(self.arguments, paths):
                try:
                    projects.append(Project(root, project_settings(self.arguments, root), group))
                except ConfigError as error:
                    errors.append(str(error))
        except ConfigError as error:  # a pyproject.toml that is no TOML, met finding a root
            errors.append(str(error))
        return projects

    def _show_errors(self, errors: list[str]) -> None:
        """Show each configuration error once while it stands (not at every keystroke); one
        corrected and made again is shown again."""
        for error in dict.fromkeys(errors):
            if error not in self.shown_errors:
                self.window_show_message(
                    types.ShowMessageParams(
                        type=types.MessageType.Error, message=f"ckptlint: {error}"
                    )
                )
        self.shown_errors = set(errors)

    def _lint_project(
        self, project: Project, documents: dict[str, TextDocument]
    ) -> dict[str, tuple[Finding, ...]]:
        """The findings of the project's open files, from their text as the editor holds it
        (excluded files: none, as for a file named on the command line)."""
        named = [path for path in project.paths if not project.settings.is_excluded(path)]
        found: dict[str, tuple[Finding, ...]] = dict.fromkeys(project.paths, ())
        if not named:
            return found
        overrides = {path: _encoded(documents[path].source) for path in named}
        engine = project.engine(self.arguments, named)
        try:
            results = engine.lint(named, overrides)
        except Exception as error:  # a bug of ours: named in the log, the session goes on
            self.log(types.MessageType.Error, f"internal error: {type(error).__name__}: {error}")
            return found
        finally:
            clear_memos()  # a long-lived process: the next run parses afresh
        for result in results:
            if result.internal_error is not None:
                self.log(
                    types.MessageType.Error,
                    f"{result.path}: internal error: {result.internal_error}",
                )
            found[result.path] = tuple(result.findings)
        for note in dict.fromkeys([*project.notes, *engine.notes]):
            self.log(types.MessageType.Warning, note)
        return found

    def _fixes(self, document: TextDocument, text: str) -> list[Finding]:
        """The findings of exactly ``text`` as the document's file, with their fixes."""
        path = _path_of(document.uri)
        if path is None:
            return []
        projects = self._projects([path])
        if not projects or projects[0].settings.is_excluded(path):
            return []
        (project,) = projects
        engine = project.engine(self.arguments, [path])
        try:
            (result,) = engine.lint([path], {path: _encoded(text)}, fixes=True)
        finally:
            clear_memos()
        return result.findings

    def publish(self, uri: str, version: int | None, diagnostics: list[types.Diagnostic]) -> None:
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=version)
        )

    def log(self, kind: types.MessageType, message: str) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=f"ckptlint: {message}"))

    # -- what the editor shows ---------------------------------------------------------------
    def diagnostics(self, linted: Linted) -> list[types.Diagnostic]:
        lines = split_lines(linted.text)
        return [
            types.Diagnostic(
                range=self._range(lines, finding),
                message=finding.message,
                severity=(
                    types.DiagnosticSeverity.Error
                    if finding.code in WHOLE_FILE_CODES
                    else types.DiagnosticSeverity.Warning
                ),
                code=finding.code,
                code_description=_rule_link(finding.code),
                source=SOURCE,
            )
            for finding in linted.findings
        ]

    def _range(self, lines: Sequence[str], finding: Finding) -> types.Range:
        """The finding's span in the editor's units (UTF-16 unless it agreed on others)."""
        codec = self.workspace.position_codec
        start = types.Position(line=finding.line - 1, character=finding.column - 1)
        end = types.Position(line=finding.end_line - 1, character=finding.end_column - 1)
        shown = [line.rstrip("\r\n") for line in lines]
        return types.Range(
            start=codec.position_to_client_units(shown, start),
            end=codec.position_to_client_units(shown, end),
        )

    def _findings_at(self, document: TextDocument, selected: types.Range) -> list[Finding]:
        """The findings of the document's current text whose lines meet ``selected``."""
        linted = self.linted.get(document.uri)
        if linted is None or linted.text != document.source:
            return []
        first, last = selected.start.line + 1, selected.end.line + 1
        return [f for f in linted.findings if f.line <= last and f.end_line >= first]

    def code_actions(self, params: types.CodeActionParams) -> list[types.CodeAction]:
        document = self.workspace.get_text_document(params.text_document.uri)
        wanted = params.context.only
        actions: list[types.CodeAction] = []
        text = document.source
        quick = wanted is None or any(
            types.CodeActionKind.QuickFix.value.startswith(kind) for kind in wanted
        )
        if quick:
            findings = self._findings_at(document, params.range)
            if any(f.fixable for f in findings):
                with_fixes = {
                    (f.line, f.column, f.code, f.message): f for f in self._fixes(document, text)
                }
                for finding in findings:
                    fixed = with_fixes.get(
                        (finding.line, finding.column, finding.code, finding.message)
                    )
                    if fixed is not None and fixed.fix is not None:
                        action = self._fix_action(document, fixed, fixed.fix)
                        if action is not None:
                            actions.append(action)
            for finding in findings:
                if finding.code in WHOLE_FILE_CODES:
                    continue
                noqa = add_noqa(text, [finding])
                if noqa.added:
                    actions.append(
                        self._action(
                            document,
                            f"{SOURCE} ({finding.code}): Disable for this line",
                            types.CodeActionKind.QuickFix,
                            noqa.text,
                            finding,
                        )
                    )
        if wanted is not None and any(FIX_ALL.startswith(kind) for kind in wanted):
            action = self._fix_all(document)
            if action is not None:
                actions.append(action)
        return actions

    def _fix_action(
        self, document: TextDocument, finding: Finding, fix: Fix
    ) -> types.CodeAction | None:
        from ckptlint.fixes import fix_text

        fixed = fix_text(document.source, [finding])
        if not fixed.applied or not _compiles(fixed.text, document.source):
            return None
        title = f"{SOURCE} ({finding.code}): {fix_title(fix)}"
        if fix.applicability == "unsafe":
            title += " (unsafe fix)"
        action = self._action(document, title, types.CodeActionKind.QuickFix, fixed.text, finding)
        action.is_preferred = fix.applicability == "safe"
        return action

    def _fix_all(self, document: TextDocument) -> types.CodeAction | None:
        """Every fix that applies with the server's options, as ``ckptlint --fix`` would
        apply them to the editor's text."""
        from ckptlint.fixes import fix_text

        unsafe = bool(self.arguments.unsafe_fixes)
        text = document.source
        fixable = [
            f for f in self._fixes(document, text) if f.fix is not None and f.fix_applies(unsafe)
        ]
        if not fixable:
            return None
        fixed = fix_text(text, fixable)
        if not fixed.applied or not _compiles(fixed.text, text):
            return None
        return self._action(
            document, f"{SOURCE}: Fix all auto-fixable problems", FIX_ALL, fixed.text, None
        )

    def _action(
        self,
        document: TextDocument,
        title: str,
        kind: str,
        new_text: str,
        finding: Finding | None,
    ) -> types.CodeAction:
        lines = split_lines(document.source)
        diagnostics = (
            None
            if finding is None
            else self.diagnostics(Linted(document.version, document.source, (finding,)))
        )
        edit = types.TextDocumentEdit(
            text_document=types.OptionalVersionedTextDocumentIdentifier(
                uri=document.uri, version=document.version
            ),
            edits=[self._text_edit(lines, document.source, new_text)],
        )
        return types.CodeAction(
            title=title,
            kind=kind,
            diagnostics=diagnostics,
            edit=types.WorkspaceEdit(document_changes=[edit]),
        )

    def _text_edit(self, lines: Sequence[str], old: str, new: str) -> types.TextEdit:
        """One edit replacing the part of ``old`` that differs from ``new``."""
        start = 0
        limit = min(len(old), len(new))
        while start < limit and old[start] == new[start]:
            start += 1
        end = 0
        while end < limit - start and old[len(old) - 1 - end] == new[len(new) - 1 - end]:
            end += 1
        first = _position(lines, start)
        last = _position(lines, len(old) - end)
        codec = self.workspace.position_codec
        shown = [line.rstrip("\r\n") for line in lines]
        return types.TextEdit(
            range=types.Range(
                start=codec.position_to_client_units(shown, first),
                end=codec.position_to_client_units(shown, last),
            ),
            new_text=new[start : len(new) - end],
        )

    def hover(self, params: types.HoverParams) -> types.Hover | None:
        """The rule's documentation, over a finding or a code in a ``# noqa`` comment."""
        from ckptlint.report import rule_markdown
        from ckptlint.rules import RULES_BY_CODE

        document = self.workspace.get_text_document(params.text_document.uri)
        position = params.position
        codes = [
            f.code for f in self._findings_at(document, types.Range(start=position, end=position))
        ]
        lines = split_lines(document.source)
        if position.line < len(lines):
            line = lines[position.line]
            noqa = NOQA.search(line)
            if noqa is not None and noqa.group("codes"):
                codes.extend(
                    code.upper() for code in re.findall(r"[A-Za-z]+[0-9]+", noqa.group("codes"))
                )
        known = [code for code in dict.fromkeys(codes) if code in RULES_BY_CODE]
        if not known:
            return None
        text = "\n\n---\n\n".join(rule_markdown(RULES_BY_CODE[code]) for code in known)
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text))


def fix_title(fix: Fix) -> str:
    """What a fix does, in the words of its code action (ruff's titles say the change)."""
    edit = fix.edit
    if isinstance(edit, AddKeyword):
        return f"Add `{edit.keyword}={edit.value}`"
    if isinstance(edit, ReplaceText):
        return f"Replace with `{edit.text}`"
    if isinstance(edit, BindNames):
        names = ", ".join(f"`{name}`" for name in edit.names)
        return f"Bind {names} when the function is made"
    raise AssertionError(f"unknown edit {edit!r}")  # pragma: no cover


def _rule_link(code: str) -> types.CodeDescription | None:
    if not RULES_PAGE.is_file():
        return None  # installed without its documentation: the hover still has it
    return types.CodeDescription(href=f"{RULES_PAGE.as_uri()}#{code.lower()}")


def _path_of(uri: str) -> str | None:
    """The file a document is (None for an unsaved buffer, which has no project)."""
    if not uri.startswith("file:"):
        return None
    return to_fs_path(uri)


def _encoded(text: str) -> bytes:
    """The editor's text as the file's bytes: in the encoding its coding declaration names
    (UTF-8 without one), as the command line reads the file."""
    data = text.encode("utf-8", "surrogateescape")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return text.encode(encoding)
    except (SyntaxError, LookupError, UnicodeEncodeError):
        return data


def _compiles(new: str, old: str) -> bool:
    """Whether ``new`` compiles, or ``old`` did not either (a fix never breaks a file)."""
    from ckptlint.fixes import compile_error

    return (
        compile_error(_encoded(new), "<fixed>") is None
        or compile_error(_encoded(old), "<text>") is not None
    )


def _position(lines: Sequence[str], offset: int) -> types.Position:
    """The line and character (code points) of an offset into the joined ``lines``."""
    for number, line in enumerate(lines):
        if offset <= len(line.rstrip("\r\n")) or number == len(lines) - 1:
            return types.Position(line=number, character=min(offset, len(line)))
        offset -= len(line)
    return types.Position(line=0, character=0)
