"""The gateway's URL resolution (gateway.asgi.GatewayASGIHandler.resolve_request): an intake path
resolves as Django resolves it, its match kept per URLconf; other paths go to Django each time."""

from __future__ import annotations

from django.http import HttpResponse
from django.test import RequestFactory, override_settings
from django.urls import path, resolve

from gateway.asgi import GatewayASGIHandler

urlpatterns = [path("v1/chat/completions", lambda request: HttpResponse("other"), name="other_chat")]


def _resolved(handler: GatewayASGIHandler, url: str):
    request = RequestFactory().post(url)
    match = handler.resolve_request(request)
    assert request.resolver_match is match
    return match


def test_an_intake_path_resolves_as_django_resolves_it_each_time():
    handler = GatewayASGIHandler()
    expected = resolve("/v1/chat/completions")
    for _ in range(2):
        match = _resolved(handler, "/v1/chat/completions")
        assert (match.func, match.args, match.kwargs, match.url_name) == (
            expected.func,
            expected.args,
            expected.kwargs,
            expected.url_name,
        )
    assert _resolved(handler, "/v1/embeddings").func is resolve("/v1/embeddings").func


def test_another_urlconf_is_resolved_anew_and_other_paths_by_django():
    handler = GatewayASGIHandler()
    _resolved(handler, "/v1/chat/completions")
    with override_settings(ROOT_URLCONF=__name__):
        assert _resolved(handler, "/v1/chat/completions").url_name == "other_chat"
    assert _resolved(handler, "/v1/chat/completions").url_name == resolve("/v1/chat/completions").url_name
    assert _resolved(handler, "/v1/models").func is resolve("/v1/models").func
