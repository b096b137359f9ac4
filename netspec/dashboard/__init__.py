"""``netspec dashboard``: runs of a workspace folder in the browser (a Starlette app served by uvicorn).

Starlette, uvicorn and plotly (whose own ``plotly.min.js`` draws the charts)
come with the ``dashboard`` extra and are imported only inside this package.
``workspace`` confines paths and finds runs, ``metrics`` reads metrics.jsonl
from where it was last read, ``runs`` says what a run holds, ``security``
checks every request, ``pages`` writes the HTML and ``app`` routes requests.
"""
