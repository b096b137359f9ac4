"""The Models pages: the local zoo's cards, one model (its card, how to get it, predictions on an uploaded
image), and the form publishing a run; their HTML and the handlers that serve them (``/models``, ``/model``,
``/publish``, ``/api/models/predict``)."""

from __future__ import annotations

import re
import urllib.parse
from html import escape

import anyio
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from netspec.dashboard.forms import parse_form
from netspec.dashboard.models import LICENSES, PublishForm, models, publish_run, publishable
from netspec.dashboard.pages import page, per_class_section, publish_link, refused_message, run_link, value
from netspec.dashboard.runs import PerClass
from netspec.dashboard.state import Dashboard
from netspec.dashboard.workspace import RefusedPathError
from netspec.errors import NetspecError
from netspec.model_zoo.card import ModelCard
from netspec.model_zoo.zoo import default_zoo


def model_link(ref: str) -> str:
    """The address of model ``name@version``'s page."""
    return "model?" + urllib.parse.urlencode({"ref": ref})


def metrics_text(card: ModelCard) -> str:
    """The card's test metrics, one ``name value`` each, comma separated."""
    return ", ".join(f"{escape(name)} {value(number)}" for name, number in card.metrics.items()) or "–"


def models_page(zoo: str, found: list[dict]) -> str:
    """A card for every model of the zoo (and the problem of each whose card cannot be read)."""
    cards = []
    for model in found:
        if "problem" in model:
            cards.append(f'<article class="card"><h2>{escape(model["ref"])}</h2>'
                         f'<p class="refused">{escape(model["problem"])}</p></article>')
            continue
        card = model["card"]
        classes = len(card.input.label_names)
        cards.append(f"""<article class="card">
<h2><a href="{escape(model_link(card.ref))}">{escape(card.ref)}</a></h2>
<p>{escape(card.summary) or '<span class="where">no summary</span>'}</p>
<p class="where">{escape(card.task)} · input {"×".join(map(str, card.input.shape))} {escape(card.input.channels)}
{f"· {classes} classes" if classes else ""} · {escape(card.license)} · published {escape(card.provenance.date[:10])}</p>
<p>{metrics_text(card)}</p>
</article>""")
    listing = "\n".join(cards) or ("<p>no models in this zoo yet: publish a finished run from its page, or "
                                   "<code>netspec zoo download</code> one</p>")
    return page("Models", f"""<h1>Models</h1>
<p class="where">the zoo in {escape(zoo)}</p>
<div id="models" class="cards">
{listing}
</div>""")


def model_page(zoo: str, card: ModelCard) -> str:
    """One model: its card (with its per-class accuracies), the commands to use and share it, and predictions on
    an image the person uploads."""
    provenance = card.provenance
    facts = [("summary", escape(card.summary) or "–"), ("task", escape(card.task)), ("licence", escape(card.license)),
             ("authors", escape(", ".join(card.authors)) or "–"),
             ("input", f'{"×".join(map(str, card.input.shape))} {escape(card.input.channels)}, scale '
                       f'{card.input.scale:g}' + (f", mean {escape(str(card.input.mean_value))}"
                                                  if card.input.mean_value else "")),
             ("classes", escape(", ".join(card.input.label_names)) or "–"), ("metrics", metrics_text(card)),
             ("published", f"{escape(provenance.date)} with netspec {escape(provenance.netspec_version)}"),
             ("trained", f"{provenance.iterations} iterations, net config {escape(provenance.config_hash[:12])}"
                         if provenance.iterations is not None else "–"),
             ("training data", f"sha256 {escape(provenance.dataset_sha256[:16])}…"
                               if provenance.dataset_sha256 else "–")]
    if provenance.caffe:
        facts.append(("imported from", escape(provenance.caffe.url)))
    rows = "".join(f"<tr><th>{name}</th><td>{text}</td></tr>" for name, text in facts)
    files = "".join(f"<tr><td>{escape(f.path)}</td><td>{f.size}</td><td><code>{escape(f.sha256[:16])}…</code></td>"
                    "</tr>" for f in card.files)
    zoo_option = "" if zoo == default_zoo() else f" --zoo {escape(quoted(zoo))}"
    return page(card.ref, f"""<h1>{escape(card.ref)}</h1>
<table class="facts">{rows}</table>
{per_class_section([PerClass(top, figures, card.input.label_names) for top, figures in card.per_class.items()],
                   "in the last test pass of its training")}
<section id="predict">
<h2>Try it on an image</h2>
<form id="predict-form" class="form" data-ref="{escape(card.ref)}">
<label>image file <input type="file" id="predict-file" accept="image/*" required></label>
<button type="submit"{"" if card.weights else " disabled"}>Predict</button>
</form>
<div class="prediction"><img id="predict-image" alt="the image predicted on" hidden>
<div><p id="predict-note" class="where" role="status"></p><table id="predictions"></table></div></div>
</section>
<section>
<h2>Use it</h2>
<pre>netspec predict {escape(card.ref)} image.png{zoo_option}
# share this zoo, and get the model on another machine:
netspec zoo serve{zoo_option}
netspec zoo download {escape(card.ref)} --from http://THIS-MACHINE:PORT</pre>
</section>
<section>
<h2>Files</h2>
<table><thead><tr><th>file</th><th>bytes</th><th>sha256</th></tr></thead><tbody>{files}</tbody></table>
</section>""")


def quoted(path: str) -> str:
    """A path as a shell word (quoted when it holds anything but plain characters)."""
    return path if re.fullmatch(r"[\w./@:+-]+", path) else "'" + path.replace("'", "'\\''") + "'"


def suggested_name(run: str) -> str:
    """A model name made from a run's path: its last part, lower case, other characters as '-'."""
    name = re.sub(r"[^a-z0-9._-]+", "-", run.rsplit("/", 1)[-1].lower()).strip("-._")
    return name or "model"


def publish_page(run: str, problem: str | None, form: dict[str, str], message: str = "") -> str:
    """The form publishing run ``run`` to the zoo (``problem``: why it cannot be published now)."""
    def field(name: str, label: str, default: str = "", placeholder: str = "") -> str:
        return (f'<label>{label} <input name="{name}" value="{escape(form.get(name, default))}" '
                f'placeholder="{escape(placeholder)}"></label>\n')

    chosen = form.get("license", LICENSES[0])
    licences = "".join(f'<option{" selected" if licence == chosen else ""}>{escape(licence)}</option>'
                       for licence in LICENSES)
    blocked = f'<p class="refused">{escape(problem)}</p>' if problem else ""
    return page(f"Publish {run}", f"""<h1>Publish <a href="{escape(run_link(run))}">{escape(run)}</a></h1>
{blocked}{refused_message(message)}
<form method="post" action="{escape(publish_link(run))}" class="form">
<p class="where">The deploy net is derived from the run's train net, the weights are its latest snapshot's, and the
card records its last test values, preprocessing, label names and provenance, as <code>netspec zoo publish
--run</code> does.</p>
{field("name", "model name", suggested_name(run))}{field("version", "version", "1")}
{field("summary", "summary", "", "one line describing the model")}
<label>licence <select name="license">{licences}</select></label>
{field("authors", "authors", "", "comma separated")}
{field("scale", "input scale", "", "the run's transform_param scale, else 1")}
<p class="where">The input scale multiplies an image's pixel values (0-255) before the net sees them: give it when
the run's data was scaled beforehand (HDF5 files of values in [0, 1] need 0.00392, that is 1/255).</p>
<button type="submit"{" disabled" if problem else ""}>Publish</button>
</form>""")


def model_ref(request: Request) -> str:
    """The ``ref`` query parameter: a model of the zoo."""
    ref = request.query_params.get("ref")
    if ref is None:
        raise RefusedPathError("name a model: ?ref=NAME@VERSION", 400)
    return ref


def show_models(request: Request) -> HTMLResponse:
    """``/models``: the zoo's cards."""
    zoo = Dashboard.of(request).zoo
    return HTMLResponse(models_page(zoo.root, models(zoo)))


def show_model(request: Request) -> HTMLResponse:
    """``/model?ref=NAME@VERSION``: a model's card, how to get it, and predictions on an image."""
    zoo = Dashboard.of(request).zoo
    return HTMLResponse(model_page(zoo.root, zoo.card(model_ref(request))))


async def predict(request: Request) -> JSONResponse:
    """``POST /api/models/predict?ref=NAME@VERSION&name=FILE``: the body's image classified, top classes as JSON."""
    ref, name = model_ref(request), request.query_params.get("name", "image")
    predictors = Dashboard.of(request).predictors
    try:
        answer = await anyio.to_thread.run_sync(predictors.predict, ref, await request.body(), name)
    except NetspecError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    return JSONResponse(answer)


def show_publish(request: Request) -> HTMLResponse:
    """``/publish?run=PATH``: the form publishing a run to the zoo."""
    run, folder = Dashboard.of(request).run(request)
    return HTMLResponse(publish_page(run, publishable(folder), {}))


async def publish(request: Request) -> Response:
    """``POST /publish?run=PATH``: publish the run and lead to the model's page, or show why not."""
    dashboard = Dashboard.of(request)
    run, folder = dashboard.run(request)
    form = parse_form(await request.body())
    try:
        card = await anyio.to_thread.run_sync(publish_run, dashboard.zoo, folder, PublishForm.from_form(form))
    except NetspecError as exc:
        page_text = publish_page(run, publishable(folder), form, str(exc))
        return HTMLResponse(page_text, status_code=getattr(exc, "status", 400))
    return RedirectResponse(model_link(card.ref), status_code=303)
