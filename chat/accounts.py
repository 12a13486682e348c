"""The account forms, throttled: logging in (the site's form and the admin's), signing up, and
asking for a password reset mail; and logging out, which says so on the login page.

The throttle (chat/limits/logins.py) counts an attempt before the password is checked; a
refused one never reaches the password check and is answered with the form again, the reason
in words, status 429 and Retry-After. A login that succeeds clears the username's count and
leaves this browser a trusted-device cookie: its later attempts as that user are counted apart,
so someone guessing the user's password elsewhere does not lock them out of their own browser.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib import messages
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.core import signing
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render

from chat.forms import SignupForm
from chat.limits.logins import LoginAttempt, get_login_throttle, username_key
from chat.limits.refusals import Rejection

log = logging.getLogger(__name__)

Response = TypeVar("Response", bound=HttpResponseBase)

# What the throttle decided for this request's login attempt (LoginAttempt or Rejection).
ATTEMPT_ATTR = "chat_login_attempt"
DEVICE_COOKIE = "chat_login_device"
DEVICE_SALT = "chat.accounts.trusted-device"
DEVICE_MAX_AGE = 365 * 86400


def client_address(request: HttpRequest) -> str:
    """daphne's peer: behind nginx the client only with --proxy-headers, nginx overwriting
    X-Forwarded-For (deploy/ does). A header the client sends is never read here."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def trusted_device(request: HttpRequest, username: str) -> str | None:
    """This browser's trusted-device id, if a login as `username` gave it one."""
    value = request.COOKIES.get(DEVICE_COOKIE)
    if not value:
        return None
    try:
        data = signing.loads(value, salt=DEVICE_SALT, max_age=DEVICE_MAX_AGE)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or data.get("u") != username_key(username):
        return None
    device = data.get("d")
    return device if isinstance(device, str) and device.isalnum() else None


class ThrottledLoginMixin(AuthenticationForm):
    """An authentication form that asks the throttle before checking the password."""

    throttled: str = ""

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        request = self.request
        if username is None or not password or request is None:
            return super().clean()  # nothing is checked without both: nothing to count
        device = trusted_device(request, username)

        async def ask() -> LoginAttempt | Rejection:
            return await get_login_throttle().login(client_address(request), username, device)

        verdict = async_to_sync(ask)()
        setattr(request, ATTEMPT_ATTR, verdict)
        if isinstance(verdict, Rejection):
            self.throttled = verdict.message
            raise ValidationError(verdict.message, code="throttled")
        cleaned = super().clean()
        verdict.succeeded = True
        return cleaned


class LoginForm(ThrottledLoginMixin):
    """The site's login form."""


class AdminLoginForm(ThrottledLoginMixin, AdminAuthenticationForm):
    """The admin's login form (staff only, as Django's)."""


def finish_login(request: HttpRequest, response: Response) -> Response:
    """What the throttle's verdict adds to a login form's response: 429 and Retry-After for a
    refused attempt; for a successful one, its username's count cleared and the cookie."""
    verdict = getattr(request, ATTEMPT_ATTR, None)
    if isinstance(verdict, Rejection):
        response.status_code = 429
        response["Retry-After"] = str(verdict.retry_after or 1)
    elif isinstance(verdict, LoginAttempt) and verdict.succeeded:

        async def forget() -> None:
            await get_login_throttle().succeeded(verdict)

        async_to_sync(forget)()
        device = trusted_device(request, verdict.username) or secrets.token_hex(16)
        response.set_cookie(
            DEVICE_COOKIE,
            signing.dumps({"u": username_key(verdict.username), "d": device}, salt=DEVICE_SALT),
            max_age=DEVICE_MAX_AGE,
            secure=settings.SESSION_COOKIE_SECURE,
            httponly=True,
            samesite="Lax",
        )
    return response


class LoginView(auth_views.LoginView):
    """The site's login page (`/accounts/login/`), throttled."""

    authentication_form = LoginForm
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return finish_login(request, super().post(request, *args, **kwargs))


class LogoutView(auth_views.LogoutView):
    """Django's logout (`POST /accounts/logout/`), then the login page says it worked: without a
    word a person could not tell a logout from a page that merely reloaded."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response: HttpResponse = super().post(request, *args, **kwargs)
        # After the session is flushed: the message travels in its own cookie (Django's
        # default storage tries the cookie first) to the page the redirect leads to.
        messages.info(request, "You are logged out.")
        return response


def signup(request: HttpRequest) -> HttpResponse:
    """Create an account: at most CHAT_SIGNUP_RATE_PER_ADDRESS from one client address. Only a
    valid form is counted (a mistyped confirmation costs nothing), and counted before the
    account is saved, so parallel posts cannot slip past the limit."""
    if request.user.is_authenticated:
        return redirect("chat:home")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():

        async def ask() -> Rejection | None:
            return await get_login_throttle().signup(client_address(request))

        rejection = async_to_sync(ask)()
        if rejection is None:
            user = form.save()
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            return redirect("chat:home")
        form.add_error(None, ValidationError(rejection.message, code="throttled"))
        response = render(request, "registration/signup.html", {"form": form}, status=429)
        response["Retry-After"] = str(rejection.retry_after or 1)
        return response
    return render(request, "registration/signup.html", {"form": form})


class ThrottledPasswordResetForm(PasswordResetForm):
    """Django's reset form, sending at most CHAT_PASSWORD_RESET_RATE_PER_EMAIL mails to one
    address. Over it nothing is sent and the page says what it always says (the same answer
    for an address with an account or without: the throttle must not tell them apart), so
    the form cannot be used to flood someone's mailbox."""

    def save(self, *args: Any, **kwargs: Any) -> None:
        email = self.cleaned_data["email"]

        async def ask() -> Rejection | None:
            return await get_login_throttle().password_reset(email)

        if async_to_sync(ask)() is not None:
            log.warning("password reset mail not sent: too many asked for this address")
            return
        super().save(*args, **kwargs)

    def send_mail(self, *args: Any, **kwargs: Any) -> None:
        """Sent from a thread of its own: the answer must not wait for the mail server, or its
        time would tell an address with an account (a mail sent) from one without (none)."""
        thread = threading.Thread(
            target=_send_reset_mail,
            args=(super().send_mail, args, kwargs),
            name="password-reset-mail",
            daemon=True,
        )
        with _mail_lock:
            _mail_threads.add(thread)
        thread.start()


_mail_threads: set[threading.Thread] = set()
_mail_lock = threading.Lock()


def _send_reset_mail(send: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        send(*args, **kwargs)  # Django's own: it logs a mail server's failure itself
    except Exception:
        log.exception("password reset mail not sent")
    finally:
        with _mail_lock:
            _mail_threads.discard(threading.current_thread())


def finish_sending_mail(timeout: float) -> bool:
    """Wait up to `timeout` s for the reset mails being sent; True when none is left. (A mail
    still being sent when the process exits is lost: its reader asks again.)"""
    deadline = time.monotonic() + timeout
    while True:
        with _mail_lock:
            pending = list(_mail_threads)
        if not pending:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        pending[0].join(left)


class PasswordResetView(auth_views.PasswordResetView):
    """`/accounts/password_reset/`: Django's view with the throttled form."""

    form_class = ThrottledPasswordResetForm
