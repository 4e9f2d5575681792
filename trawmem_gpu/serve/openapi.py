"""The OpenAPI side of the app: bodies read by hand documented as FastAPI would, and ``/docs``
served offline."""
from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel


def documented_body(model: type[BaseModel], *security) -> dict:
    """``openapi_extra`` of a route that reads ``model`` with :func:`body_of`: the JSON body and the
    accepted keys, as FastAPI writes them for a body parameter and security dependencies (the
    schema itself is added to the components by :func:`with_models`)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}},
        "security": [{s.scheme_name: []} for s in security]}


def with_models(app: FastAPI, models: list[type[BaseModel]]):
    """``app.openapi`` that also puts ``models`` (and the models they use) into the components."""
    from pydantic.json_schema import models_json_schema

    plain = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            spec = plain()
            _, defs = models_json_schema([(m, "validation") for m in models],
                                         ref_template="#/components/schemas/{model}")
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in defs.get("$defs", {}).items():
                schemas.setdefault(name, schema)
            app.openapi_schema = spec
        return app.openapi_schema

    return openapi


def offline_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) from the assets of the ``swagger-ui-bundle`` package, served by this
    server under ``/docs-assets`` (FastAPI's default page loads them from a CDN, which an offline or
    locked-down deployment cannot reach). Without the package there is no ``/docs``; the schema
    stays at ``/openapi.json``."""
    try:
        import swagger_ui_bundle
    except ImportError:
        return
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} - API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon-32x32.png")
