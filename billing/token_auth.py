"""The report API's token authentication: `Authorization: Bearer fgr_...` (tenants.tokens). An API
key there authenticates nothing; a bad, expired or revoked report token is 401."""

from __future__ import annotations

from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed

from tenants.tokens import token_looks_like, token_user


class ReportTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        token = token.strip()
        if not token_looks_like(token):
            raise AuthenticationFailed("The report API takes a report token (fgr_...), not an API key.")
        found = token_user(token)
        if found is None:
            raise AuthenticationFailed("Report token unknown, expired or revoked.")
        return found

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="fairgate-reports"'
