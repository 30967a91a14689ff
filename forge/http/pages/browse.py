"""Web pages for browsing a repository: home (README or setup steps), folders with each entry's
last commit, files, blame, the log and a path's history, commits (unified or split diff),
branches and compare. Every page names the ref it shows and offers the branch/tag switcher.

The pygit2 work runs in `RepoStore`'s threads, highlighting in `asyncio.to_thread`; an unknown
ref or path is the git layer's `RefNotFound`/`PathNotFound`, rendered as a 404 page with its code.
"""

from typing import Annotated, Any, Literal
from urllib.parse import quote

from litestar import Controller, get
from litestar.params import FromPath, QueryParameter
from litestar.response import Redirect, Template

from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.git import (
    BlobInfo,
    NotABlob,
    NotATree,
    commit_diff,
    compare,
    is_markdown,
    list_branches,
    list_tags,
    list_tree,
    log,
    read_blob,
)
from forge.git.blame import DEFAULT_MAX_BYTES as BLAME_MAX_BYTES
from forge.git.blame import DEFAULT_MAX_LINES as BLAME_MAX_LINES
from forge.git.blame import blame_file
from forge.git.browse import ref_names
from forge.git.history import path_history, tree_page
from forge.http.deps import DbSession, StoreDep
from forge.http.pages.browse_render import ago, breadcrumbs, diff_views_async, exact, highlight_lines_async, url_path
from forge.http.pages.render import highlight_async, markdown_async
from forge.http.pages.repos import REPO, VIEWS, Ref, RepoView, ViewsDep
from forge.repos import statuses

View = Annotated[Literal["unified", "split"], QueryParameter(name="view")]
PageNo = Annotated[int, QueryParameter(name="page", ge=1, le=100_000)]


class Browse:
    """Renders one browsing page: the ref switcher's data and the helpers every template uses."""

    def __init__(self, view: RepoView, store: StoreDep, ref: str | None) -> None:
        self.view = view
        self.store = store
        self.ref = ref

    async def render(self, template: str, here: str, path: str = "", status_code: int = 200, **extra: Any) -> Template:
        refs = await self.store.read(self.view.key, ref_names)
        current = self.ref or self.view.res.repo.default_branch
        if current.startswith(("refs/heads/", "refs/tags/")):  # a full ref name, shown as people say it
            short = current.removeprefix("refs/heads/").removeprefix("refs/tags/")
            kind = "branch" if current.startswith("refs/heads/") else "tag"
            current = short
        else:
            kind = "branch" if current in refs.branches else "tag" if current in refs.tags else "commit"
        return self.view.render(
            template,
            status_code,
            ref=self.ref,
            current_ref=current,
            current_kind=kind,
            refs=refs,
            here=here,
            path=path,
            crumbs=breadcrumbs(path),
            ago=ago,
            exact=exact,
            url_path=url_path,
            **extra,
        )


async def _readme_html(readme: BlobInfo | None) -> Any:
    if readme is None or readme.text is None:
        return None
    if is_markdown(readme.path):
        return await markdown_async(readme.text)
    return await highlight_async("x.txt", readme.text)


def _at(view: RepoView, kind: str, path: str, ref: str | None) -> str:
    query = f"?ref={quote(ref, safe='/')}" if ref else ""
    return f"/{view.res.full_name}{kind}{url_path(path.strip('/'))}{query}"


class RepoPages(Controller):
    path = REPO
    include_in_schema = False
    dependencies = VIEWS

    async def _folder(
        self, views: ViewsDep, store: StoreDep, path: str, ref: str | None, template: str
    ) -> Template | Redirect:
        view = await views.load()
        try:
            data = await store.read(view.key, tree_page, ref, path.strip("/"))
        except NotATree:  # a file's path under /tree/: show the file, as people expect
            return Redirect(_at(view, "/blob/", path, ref), status_code=302)
        return await Browse(view, store, ref).render(
            template,
            f"/tree/{url_path(data.listing.path)}" if data.listing.path else "/tree",
            data.listing.path,
            tree=data.listing,
            last=data.last,
            readme=data.readme,
            readme_html=await _readme_html(data.readme),
        )

    @get("/")
    async def home(self, views: ViewsDep, store: StoreDep, ref: Ref = None) -> Template | Redirect:
        return await self._folder(views, store, "", ref, "repos/home.html")

    @get(["/tree", "/tree/{path:path}"])
    async def tree(
        self, views: ViewsDep, store: StoreDep, path: FromPath[str] = "/", ref: Ref = None
    ) -> Template | Redirect:
        return await self._folder(views, store, path, ref, "repos/tree.html")

    @get("/blob/{path:path}")
    async def blob(self, views: ViewsDep, store: StoreDep, path: FromPath[str], ref: Ref = None) -> Template | Redirect:
        view = await views.load()
        try:
            info = await store.read(view.key, read_blob, ref, path.strip("/"))
        except NotABlob as not_blob:
            # A folder is listed instead; a submodule is neither, and stays the 422.
            try:
                await store.read(view.key, list_tree, ref, path.strip("/"))
            except NotATree:
                raise not_blob from None
            return Redirect(_at(view, "/tree/", path, ref), status_code=302)
        code = await highlight_async(info.name, info.text) if info.text is not None else None
        rendered = await markdown_async(info.text) if info.text is not None and is_markdown(info.path) else None
        return await Browse(view, store, ref).render(
            "repos/blob.html", f"/blob/{url_path(info.path)}", info.path, blob=info, code=code, rendered=rendered
        )

    @get("/blame/{path:path}")
    async def blame(self, views: ViewsDep, store: StoreDep, path: FromPath[str], ref: Ref = None) -> Template:
        view = await views.load()
        found = await store.read(view.key, blame_file, ref, path.strip("/"))
        html = await highlight_lines_async(found.path, found.lines)
        return await Browse(view, store, ref).render(
            "repos/blame.html",
            f"/blame/{url_path(found.path)}",
            found.path,
            blame=found,
            html=html,
            max_kb=BLAME_MAX_BYTES // 1024,
            max_lines=BLAME_MAX_LINES,
        )

    @get(["/commits", "/commits/{path:path}"])
    async def commits(
        self, views: ViewsDep, store: StoreDep, path: FromPath[str] = "/", ref: Ref = None, page_: PageNo = 1
    ) -> Template:
        view = await views.load()
        norm = path.strip("/")
        if norm:
            history = await store.read(view.key, path_history, ref, norm, page=page_, per_page=30)
            commits, page_no, has_next, truncated = history.commits, history.page, history.has_next, history.truncated
            walked = history.walked
        else:
            found = await store.read(view.key, log, ref, page=page_, per_page=30)
            commits, page_no, has_next, truncated, walked = found.commits, found.page, found.has_next, False, 0
        here = f"/commits/{url_path(norm)}" if norm else "/commits"
        return await Browse(view, store, ref).render(
            "repos/commits.html",
            here,
            norm,
            commits=commits,
            page_no=page_no,
            has_next=has_next,
            truncated=truncated,
            walked=walked,
        )

    @get("/commit/{sha:str}")
    async def commit(
        self, views: ViewsDep, store: StoreDep, db_session: DbSession, sha: FromPath[str], view_: View = "unified"
    ) -> Template:
        view = await views.load()
        diff = await store.read(view.key, commit_diff, sha)
        files = await diff_views_async(diff.files, view_)
        api = f"{view.base_url}/api/v1/repos/{view.res.full_name}"
        return await Browse(view, store, None).render(
            "repos/commit.html",
            "/tree",
            diff=diff,
            files=files,
            diff_view=view_,
            diff_base=f"/commit/{diff.commit.sha}",
            checks=await statuses.combined_status(db_session, view.res, diff.commit.sha, api),
        )

    @get("/branches")
    async def branches(self, views: ViewsDep, store: StoreDep, db_session: DbSession) -> Template:
        view = await views.load()
        found = await store.read(view.key, list_branches)
        return await Browse(view, store, None).render(
            "repos/branches.html",
            "/tree",
            branches=found,
            tags=await store.read(view.key, list_tags),
            checks=await statuses.combined_states(db_session, view.res.repo.id, [b.sha for b in found]),
        )

    @get("/compare/{spec:path}")
    async def compare_page(
        self, views: ViewsDep, store: StoreDep, spec: FromPath[str], view_: View = "unified"
    ) -> Template:
        view = await views.load()
        spec = spec.strip("/")
        base, sep, head = spec.partition("...")
        if not (sep and base and head):
            # The API's refusal, as a page: the same status and code.
            raise InvalidInput("compare needs base...head", code=Code.INVALID_COMPARE)
        comparison = await store.read(view.key, compare, base, head)  # unknown refs: 404 ref_not_found
        return await Browse(view, store, None).render(
            "repos/compare.html",
            "/tree",
            cmp=comparison,
            spec=spec,
            files=await diff_views_async(comparison.files, view_),
            diff_view=view_,
            diff_base=f"/compare/{spec}",
        )
