"""Every ```python block of README.md and docs/*.md runs as a test, collected and run by pytest-markdown-docs.

- the files: `testpaths` in pyproject.toml names README.md and docs/ beside tests/, and `pytest_collect_file`
  below hands them to the runner's collector (so `python -m pytest` runs them without `--markdown-docs`, which
  would also scan every module's docstrings);
- the runner's fence options: ```python notest (shows output, or a fragment that cannot run on its own),
  ```python continuation (runs after the file's previous block, with its names), and ```python slow (runs
  under `python -m pytest -m slow` only);
- each block runs in a fresh temporary folder holding a link to the repository's configs/, so it may read the
  shipped configs and write its outputs without touching the checkout.
"""
from pathlib import Path

import pytest
from pytest_markdown_docs.plugin import MarkdownInlinePythonItem, MarkdownTextFile

ROOT = Path(__file__).resolve().parent


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if parent.config.option.markdowndocs:  # `--markdown-docs` given: the plugin collects Markdown files itself
        return None
    if file_path.suffix == ".md" and (file_path == ROOT / "README.md" or file_path.parent == ROOT / "docs"):
        return MarkdownTextFile.from_parent(parent, path=file_path)
    return None


def fence_options(item: MarkdownInlinePythonItem) -> list[str]:
    """The words after the language on the block's opening fence (``start_line`` is its 1-based line)."""
    return item.path.read_text(encoding="utf8").splitlines()[item.start_line - 1].split()[1:]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, MarkdownInlinePythonItem) and "slow" in fence_options(item):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _doc_block_folder(request: pytest.FixtureRequest) -> None:
    if isinstance(request.node, MarkdownInlinePythonItem):
        folder = request.getfixturevalue("tmp_path")
        (folder / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
        request.getfixturevalue("monkeypatch").chdir(folder)
