"""``netspec dashboard``: runs of a workspace folder in the browser (a Starlette app served by uvicorn).

Starlette, uvicorn and plotly (whose own ``plotly.min.js`` draws the charts)
come with the ``dashboard`` extra and are imported only inside this package.
``workspace`` confines paths and finds runs, ``metrics`` reads metrics.jsonl
from where it was last read, ``runs`` says what a run holds, ``security``
checks every request, ``state`` holds what one app serves, the page modules
(``pages``, ``dataset_pages``, ``model_pages``) write the HTML and hold the
handlers that serve it, and ``app`` is the table of routes.
"""
