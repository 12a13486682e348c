"""The admin site: Django's own, with its URL arguments checked before a view reads them."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib import admin
from django.contrib.admin.options import TO_FIELD_VAR
from django.http import HttpRequest, HttpResponseBase

from chat.accounts import AdminLoginForm, finish_login
from chat.forms import InvalidInput

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


class ChatAdminSite(admin.AdminSite):
    """`admin.site` (chat.apps.ChatAdminConfig makes it the default site)."""

    # chatsite's own names, not Django's "Django administration" and "Django site admin".
    site_header = "chatsite admin"
    site_title = "chatsite admin"
    index_title = "Plans, usage, models and chats"

    # The admin's login is throttled like the site's (issue 13.5): per address and username.
    login_form = AdminLoginForm

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        return finish_login(request, super().login(request, extra_context))

    def admin_view(self, view: View, cacheable: bool = False) -> View:
        inner = super().admin_view(view, cacheable)

        @wraps(inner)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            # Django's change and delete views look up `?_to_field=` as a field name; an empty
            # one is not refused there but fails the lookup (a 500, found by
            # tests/test_security_http_fuzz.py).
            if request.POST.get(TO_FIELD_VAR, request.GET.get(TO_FIELD_VAR)) == "":
                raise InvalidInput("The admin's _to_field argument cannot be empty.")
            return inner(request, *args, **kwargs)

        return cast(View, checked)
