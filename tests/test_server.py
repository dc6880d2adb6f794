"""``ckptlint server`` driven over standard input and output by a real LSP client (pytest-lsp,
itself on pygls), as an editor drives it: one server process for the module, each test in a
project of its own on disk.

The projects are two-module packages whose finding in one module comes from the other: a
wrapper in ``wrappers.py`` hands its ``**kwargs`` on to torch's checkpoint, so a caller in
``model.py`` that leaves ``use_reentrant`` out is reported, unless the wrapper sets it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.protocol import default_converter
from pygls.uris import from_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

from tests.conftest import SUBPROCESS_TIMEOUT, run_cli

WRAPPER_LEAVES_IT = """\
from torch.utils.checkpoint import checkpoint


def run(fn, *args, **kwargs):
    kwargs.setdefault("preserve_rng_state", True)
    return checkpoint(fn, *args, **kwargs)
"""
WRAPPER_SETS_IT = WRAPPER_LEAVES_IT.replace('"preserve_rng_state", True', '"use_reentrant", False')
MODEL = """\
from .wrappers import run


def forward(block, x):
    return run(block, x)  # the call the wrapper leaves use_reentrant to
"""
MESSAGE_START = "`run()` called without `use_reentrant`"


def make_client() -> LanguageClient:
    """pytest-lsp's client, keeping every diagnostics notification in order (its own keeps
    only the last for each file): a test waits for a publication made after its edit."""
    client = LanguageClient(converter_factory=default_converter)
    client.published = []  # type: ignore[attr-defined]
    client.registrations = []  # type: ignore[attr-defined]

    def published(client: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        client.diagnostics[params.uri] = params.diagnostics
        client.published.append(params)  # type: ignore[attr-defined]

    def register(client: LanguageClient, params: types.RegistrationParams) -> None:
        client.registrations.extend(params.registrations)  # type: ignore[attr-defined]

    features = {
        **DEFAULT_CLIENT_FEATURES,
        types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: published,
        types.CLIENT_REGISTER_CAPABILITY: register,
    }
    register_lsp_features(client, features)
    return client


@pytest_lsp.fixture(
    scope="module",
    config=ClientServerConfig(
        server_command=[sys.executable, "-m", "ckptlint", "server", "--unsafe-fixes"],
        client_factory=make_client,
    ),
)
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(
        types.InitializeParams(capabilities=client_capabilities("visual-studio-code"))
    )
    yield
    await lsp_client.shutdown_session()


def write_package(root: Path, wrapper: str = WRAPPER_LEAVES_IT) -> Path:
    (root / ".git").mkdir()
    package = root / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "wrappers.py").write_text(wrapper)
    (package / "model.py").write_text(MODEL)
    return package


async def published_for(
    client: LanguageClient,
    uri: str,
    after: int,
    wanted: Callable[[Sequence[types.Diagnostic]], bool] = lambda diagnostics: True,
) -> Sequence[types.Diagnostic]:
    """The diagnostics of the first publication for ``uri`` after the first ``after``
    that ``wanted`` accepts."""

    async def wait() -> Sequence[types.Diagnostic]:
        seen = after
        while True:
            published = client.published  # type: ignore[attr-defined]
            for params in published[seen:]:
                if params.uri == uri and wanted(params.diagnostics):
                    return list(params.diagnostics)
            seen = len(published)
            await asyncio.sleep(0.02)

    return await asyncio.wait_for(wait(), SUBPROCESS_TIMEOUT)


def open_file(client: LanguageClient, path: Path, version: int = 1) -> str:
    uri = from_fs_path(str(path))
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=version, text=path.read_text()
            )
        )
    )
    return uri


def change_file(client: LanguageClient, uri: str, text: str, version: int) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


def close_file(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


def count(client: LanguageClient) -> int:
    return len(client.published)  # type: ignore[attr-defined]


def applied(text: str, edits: Sequence[types.TextEdit]) -> str:
    """``text`` with LSP edits applied (positions in UTF-16 code units, as negotiated with
    VS Code's capabilities)."""
    lines = text.splitlines(keepends=True)

    def offset(position: types.Position) -> int:
        line = lines[position.line] if position.line < len(lines) else ""
        units = line.encode("utf-16-le")[: position.character * 2].decode("utf-16-le")
        return sum(len(line) for line in lines[: position.line]) + len(units)

    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character))[::-1]:
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]
    return text


def as_found(diagnostics: Sequence[types.Diagnostic]) -> list[tuple]:
    """Diagnostics as the CLI's JSON reports findings: 1-based lines and columns."""
    return [
        (
            d.code,
            d.range.start.line + 1,
            d.range.start.character + 1,
            d.range.end.line + 1,
            d.range.end.character + 1,
            d.message,
        )
        for d in diagnostics
    ]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_finding_from_another_module_is_published_and_cleared_by_its_edit(
    client: LanguageClient, tmp_path: Path
) -> None:
    package = write_package(tmp_path)
    before = count(client)
    model = open_file(client, package / "model.py")
    diagnostics = await published_for(client, model, before)
    assert [(d.code, d.range.start.line, d.range.start.character) for d in diagnostics] == [
        ("CKP001", 4, 11)
    ]
    assert diagnostics[0].message.startswith(MESSAGE_START)
    assert diagnostics[0].source == "ckptlint"
    assert diagnostics[0].code_description.href.endswith("docs/rules.md#ckp001")

    # The diagnostics are exactly the command line's for the file.
    cli = run_cli("--format", "json", "--no-cache", "pkg/model.py", cwd=tmp_path)
    assert as_found(diagnostics) == [
        (f["code"], f["line"], f["column"], f["end_line"], f["end_column"], f["message"])
        for f in json.loads(cli.stdout)
    ]

    # The wrapper, edited (not saved), now sets use_reentrant: the caller's finding goes.
    wrappers = open_file(client, package / "wrappers.py")
    before = count(client)
    change_file(client, wrappers, WRAPPER_SETS_IT, 2)
    assert await published_for(client, model, before) == []
    # Edited back: it is published again.
    before = count(client)
    change_file(client, wrappers, WRAPPER_LEAVES_IT, 3)
    again = await published_for(client, model, before)
    assert as_found(again) == as_found(diagnostics)

    # Closed unsaved, the wrapper's text on disk stands for it again: nothing changes.
    close_file(client, wrappers)
    close_file(client, model)


def watched_change(client: LanguageClient, path: Path) -> None:
    """What an editor sends for a file it watches that changed on disk."""
    client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            changes=[
                types.FileEvent(uri=from_fs_path(str(path)), type=types.FileChangeType.Changed)
            ]
        )
    )


def test_the_server_asks_the_editor_to_watch_what_decides_findings(
    client: LanguageClient,
) -> None:
    """Registered at initialisation (VS Code's capabilities allow it): the Python files, the
    configuration and the ignore files, which an edit outside the editor may change."""
    (registration,) = client.registrations  # type: ignore[attr-defined]
    assert registration.method == "workspace/didChangeWatchedFiles"
    options = registration.register_options
    patterns = [watcher["globPattern"] for watcher in options["watchers"]]
    assert patterns == ["**/*.py", "**/pyproject.toml", "**/.gitignore", "**/.git/info/exclude"]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_change_on_disk_of_a_closed_module_is_seen_when_saved_elsewhere(
    client: LanguageClient, tmp_path: Path
) -> None:
    """A module no editor holds is read from disk: a watched-files change re-lints."""
    package = write_package(tmp_path, WRAPPER_SETS_IT)
    before = count(client)
    model = open_file(client, package / "model.py")
    assert await published_for(client, model, before) == []
    (package / "wrappers.py").write_text(WRAPPER_LEAVES_IT)
    before = count(client)
    watched_change(client, package / "wrappers.py")
    found = await published_for(client, model, before)
    assert [d.code for d in found] == ["CKP001"]

    # The configuration changed on disk: the open file is linted with it.
    (tmp_path / "pyproject.toml").write_text('[tool.ckptlint]\nignore = ["CKP001"]\n')
    before = count(client)
    watched_change(client, tmp_path / "pyproject.toml")
    assert await published_for(client, model, before) == []
    close_file(client, model)


async def actions_at(
    client: LanguageClient, uri: str, diagnostic: types.Diagnostic, only: list[str] | None = None
) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic], only=only),
        )
    )
    return [action for action in result or [] if isinstance(action, types.CodeAction)]


def edits_of(action: types.CodeAction) -> list[types.TextEdit]:
    assert action.edit is not None and action.edit.document_changes is not None
    (change,) = action.edit.document_changes
    assert isinstance(change, types.TextDocumentEdit)
    return [edit for edit in change.edits if isinstance(edit, types.TextEdit)]


@pytest.mark.asyncio(loop_scope="module")
async def test_code_actions_fix_the_finding_or_suppress_it(
    client: LanguageClient, tmp_path: Path
) -> None:
    package = write_package(tmp_path)
    before = count(client)
    model = open_file(client, package / "model.py")
    (diagnostic,) = await published_for(client, model, before)

    actions = await actions_at(client, model, diagnostic)
    assert [(a.title, a.kind) for a in actions] == [
        ("ckptlint (CKP001): Add `use_reentrant=False` (unsafe fix)", "quickfix"),
        ("ckptlint (CKP001): Disable for this line", "quickfix"),
    ]
    fix, noqa = actions
    assert not fix.is_preferred  # an unsafe fix is never applied without a look
    fixed = applied(MODEL, edits_of(fix))
    assert fixed == MODEL.replace("run(block, x)", "run(block, x, use_reentrant=False)")
    suppressed = applied(MODEL, edits_of(noqa))
    assert suppressed == MODEL.replace("use_reentrant to\n", "use_reentrant to  # noqa: CKP001\n")

    # Applied in the editor: the finding goes.
    for version, text in enumerate((fixed, suppressed), start=2):
        before = count(client)
        change_file(client, model, text, version)
        assert await published_for(client, model, before) == []
    before = count(client)
    change_file(client, model, MODEL, 4)
    (diagnostic,) = await published_for(client, model, before)

    # Fix all: the unsafe fix too, as the server runs with --unsafe-fixes.
    (fix_all,) = await actions_at(client, model, diagnostic, only=["source.fixAll"])
    assert (fix_all.title, fix_all.kind) == (
        "ckptlint: Fix all auto-fixable problems",
        "source.fixAll.ckptlint",
    )
    assert applied(MODEL, edits_of(fix_all)) == fixed
    close_file(client, model)


@pytest.mark.asyncio(loop_scope="module")
async def test_hover_shows_the_rules_documentation(client: LanguageClient, tmp_path: Path) -> None:
    package = write_package(tmp_path)
    before = count(client)
    model = open_file(client, package / "model.py")
    (diagnostic,) = await published_for(client, model, before)
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=model), position=diagnostic.range.start
        )
    )
    assert hover is not None and isinstance(hover.contents, types.MarkupContent)
    text = hover.contents.value
    assert text.startswith("# CKP001\n\n`missing-use-reentrant`: ")
    assert run_cli("--explain", "CKP001", cwd=tmp_path).stdout == text
    close_file(client, model)


@pytest.mark.asyncio(loop_scope="module")
async def test_excluded_and_unrelated_files_get_no_diagnostics(
    client: LanguageClient, tmp_path: Path
) -> None:
    package = write_package(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.ckptlint]\nexclude = ["pkg/model.py"]\n')
    before = count(client)
    model = open_file(client, package / "model.py")
    assert await published_for(client, model, before) == []
    # A buffer never saved (no file, no project): never linted, asked about without harm.
    before = count(client)
    untitled = "untitled:Untitled-1"
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=untitled, language_id="python", version=1, text=MODEL
            )
        )
    )
    plain = tmp_path / "plain.py"
    plain.write_text(textwrap.dedent("x = 1\n"))
    uri = open_file(client, plain)
    assert await published_for(client, uri, before) == []
    at_start = types.Range(start=types.Position(4, 11), end=types.Position(4, 11))
    diagnostic = types.Diagnostic(range=at_start, message="", code="CKP001")
    assert await actions_at(client, untitled, diagnostic) == []
    assert await actions_at(client, untitled, diagnostic, only=["source.fixAll"]) == []
    published = client.published[before:]  # type: ignore[attr-defined]
    assert [params.uri for params in published] == [uri]
    close_file(client, untitled)
    close_file(client, uri)
    close_file(client, model)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_wrong_configuration_is_shown_to_the_user_once(
    client: LanguageClient, tmp_path: Path
) -> None:
    package = write_package(tmp_path)
    before = count(client)
    model = open_file(client, package / "model.py")
    assert [d.code for d in await published_for(client, model, before)] == ["CKP001"]

    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.ckptlint]\nignore = "CKP001"\n')
    shown = len(client.messages)
    before = count(client)
    watched_change(client, config)
    # The findings made with the old settings go; the error is shown in their place.
    assert await published_for(client, model, before) == []
    assert len(client.messages) == shown + 1
    said = client.messages[shown]
    assert said.type == types.MessageType.Error
    assert said.message == (
        f"ckptlint: {config}: [tool.ckptlint] ignore: expected a list of "
        "strings, got 'CKP001' (a list of one: ['CKP001'])"
    )

    # Typing in the file does not show it again at each edit...
    for version in (2, 3):
        change_file(client, model, MODEL + "\n" * version, version)
    await client.text_document_hover_async(  # answered after both edits were linted
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=model),
            position=types.Position(line=0, character=0),
        )
    )
    assert len(client.messages) == shown + 1
    # ...and once corrected, the findings are back.
    config.write_text('[tool.ckptlint]\nignore = ["CKP101"]\n')
    before = count(client)
    watched_change(client, config)
    assert [d.code for d in await published_for(client, model, before)] == ["CKP001"]
    close_file(client, model)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_code_action_asked_right_after_an_edit_is_for_the_new_text(
    client: LanguageClient, tmp_path: Path
) -> None:
    """Edits are linted together a moment after they arrive; a request for code actions
    in between sees the text the editor sent last."""
    package = write_package(tmp_path)
    before = count(client)
    model = open_file(client, package / "model.py")
    (diagnostic,) = await published_for(client, model, before)
    fixed = MODEL.replace("run(block, x)", "run(block, x, use_reentrant=False)")
    change_file(client, model, fixed, 2)
    assert await actions_at(client, model, diagnostic) == []
    change_file(client, model, MODEL, 3)
    assert [a.title for a in await actions_at(client, model, diagnostic)] == [
        "ckptlint (CKP001): Add `use_reentrant=False` (unsafe fix)",
        "ckptlint (CKP001): Disable for this line",
    ]
    close_file(client, model)


@pytest.mark.asyncio(loop_scope="module")
async def test_edits_that_arrive_together_are_linted_once() -> None:
    """In the server's process: three edits before the lint starts are one lint, which
    publishes the three files' diagnostics; nothing is left scheduled after it."""
    from ckptlint.cli import parse_arguments
    from ckptlint.server import CheckpointServer

    server = CheckpointServer(parse_arguments(["server"]))
    lints: list[set[str]] = []
    server.lint_open_documents = lambda always=(): lints.append(set(always))  # type: ignore[method-assign]
    for uri in ("file:///a.py", "file:///b.py", "file:///a.py"):
        server.ask_lint({uri})
    server.ask_lint()  # a watched file changed
    assert lints == []
    while not lints:
        await asyncio.sleep(0.01)
    assert lints == [{"file:///a.py", "file:///b.py"}]
    assert (server.pending, server._timer) == (None, None)
