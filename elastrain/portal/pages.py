"""The portal's HTML pages: thin Jinja2 shells; the page scripts fill them from the REST API."""

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

PORTAL_DIR = Path(__file__).resolve().parent
STATIC_URL = "/static"

# Scripts and connections only from this server (no CDN, no inline script); the chart and terminal
# libraries set inline styles, hence 'unsafe-inline' for styles only.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
FRAMEWORKS = [
    ("horovod", "Horovod"),
    ("deepspeed", "DeepSpeed"),
    ("megatron", "Megatron-LM"),
    ("pytorch", "PyTorch"),
    ("slurm", "Slurm"),
]


def add_pages(app: FastAPI) -> None:
    """Mount the static files and register every page route (none of them appear in the OpenAPI)."""
    templates = Jinja2Templates(directory=str(PORTAL_DIR / "templates"))
    app.mount(STATIC_URL, StaticFiles(directory=str(PORTAL_DIR / "static")), name="portal-static")
    router = APIRouter(include_in_schema=False)

    def page(request: Request, template: str, title: str, **context: object) -> Response:
        response = templates.TemplateResponse(
            request, template, {"title": title, "static": STATIC_URL, "frameworks": FRAMEWORKS, **context}
        )
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @router.get("/", response_class=HTMLResponse)
    def index() -> Response:
        return RedirectResponse("/clusters", status_code=307)

    @router.get("/signin", response_class=HTMLResponse)
    def signin(request: Request) -> Response:
        return page(request, "signin.html", "Sign in")

    @router.get("/clusters", response_class=HTMLResponse)
    def clusters(request: Request) -> Response:
        return page(request, "clusters.html", "Distributed training clusters")

    @router.get("/clusters/new", response_class=HTMLResponse)
    def create(request: Request) -> Response:
        return page(request, "create.html", "Create cluster")

    @router.get("/clusters/{name}", response_class=HTMLResponse)
    def cluster(request: Request, name: str) -> Response:
        # the job box starts with the cluster's `first_job` (cluster.js, from the API)
        return page(request, "cluster.html", f"Cluster {name}", cluster=name)

    @router.get("/clusters/{name}/terminal", response_class=HTMLResponse)
    def terminal(request: Request, name: str) -> Response:
        return page(request, "terminal.html", f"Terminal: {name}", cluster=name)

    @router.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job(request: Request, job_id: int) -> Response:
        return page(request, "job.html", f"Job {job_id}", job_id=job_id)

    app.include_router(router)
