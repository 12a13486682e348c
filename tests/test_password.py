"""Password change and reset by email (issue 17.7), with Django's own views: the forms, the
mail, the link working once, other sessions ending, CSRF; the email backend from settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.mail.backends import locmem
from django.test import Client

from chat.accounts import finish_sending_mail
from tests.servers import ROOT

pytestmark = pytest.mark.django_db
NEW = "a-brand-new-passphrase-77"


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_changing_the_password_ends_the_other_sessions_but_not_this_one(owner: Any) -> None:
    here, elsewhere = logged_in(owner), logged_in(owner)
    page = here.get("/accounts/password_change/")
    assert page.status_code == 200 and 'name="old_password"' in page.content.decode()
    wrong = here.post(
        "/accounts/password_change/",
        {"old_password": "not-it", "new_password1": NEW, "new_password2": NEW},
    )
    assert wrong.status_code == 200 and "incorrect" in wrong.content.decode()
    response = here.post(
        "/accounts/password_change/",
        {"old_password": "owner-pass-123456", "new_password1": NEW, "new_password2": NEW},
    )
    assert response.status_code == 302 and response["Location"] == "/accounts/password_change/done/"
    assert "Password changed" in here.get(response["Location"]).content.decode()
    assert here.get("/").status_code == 200  # still signed in here
    assert elsewhere.get("/").status_code == 302  # the other device was signed out
    owner.refresh_from_db()
    assert owner.check_password(NEW)


def test_the_password_change_needs_a_login_and_the_csrf_token(owner: Any) -> None:
    response = Client().get("/accounts/password_change/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    data = {"old_password": "owner-pass-123456", "new_password1": NEW, "new_password2": NEW}
    assert client.post("/accounts/password_change/", data).status_code == 403
    owner.refresh_from_db()
    assert owner.check_password("owner-pass-123456")


def test_a_reset_link_by_email_sets_a_new_password_once(owner: Any) -> None:
    owner.email = "owner@example.com"
    owner.save()
    assert "Forgot your password?" in Client().get("/accounts/login/").content.decode()
    client = Client()
    response = client.post("/accounts/password_reset/", {"email": "owner@example.com"})
    assert response.status_code == 302 and response["Location"] == "/accounts/password_reset/done/"
    assert finish_sending_mail(10)
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["owner@example.com"] and "chatsite" in message.subject
    link = re.search(r"http://testserver(/accounts/reset/\S+/)", message.body)
    assert link, message.body
    form = client.get(link.group(1), follow=True)
    assert "Choose a new password" in form.content.decode()
    # A weak password is refused, its reasons filed under the new password, not its confirmation.
    weak = client.post(
        form.redirect_chain[-1][0], {"new_password1": "qwerty", "new_password2": "qwerty"}
    )
    assert weak.status_code == 200
    assert "too common" in " ".join(weak.context["form"].errors["new_password1"])
    assert "new_password2" not in weak.context["form"].errors
    done = client.post(form.redirect_chain[-1][0], {"new_password1": NEW, "new_password2": NEW})
    assert done.status_code == 302 and done["Location"] == "/accounts/reset/done/"
    owner.refresh_from_db()
    assert owner.check_password(NEW)
    # The link works once.
    again = Client().get(link.group(1), follow=True)
    assert "This link does not work" in again.content.decode()


def test_an_unknown_address_gets_the_same_answer_and_no_mail() -> None:
    response = Client().post("/accounts/password_reset/", {"email": "nobody@example.com"})
    assert response.status_code == 302 and response["Location"] == "/accounts/password_reset/done/"
    assert finish_sending_mail(10)
    assert mail.outbox == []


class HeldMailServer(locmem.EmailBackend):
    """A mail server that answers only when the test lets it (the in-memory outbox behind)."""

    release = threading.Event()
    sending = threading.Event()

    def send_messages(self, messages: Any) -> int:
        HeldMailServer.sending.set()
        assert HeldMailServer.release.wait(10), "the test never let the mail go"
        return super().send_messages(messages)


def test_the_reset_answer_does_not_wait_for_the_mail_server(owner: Any, settings: Any) -> None:
    """Hostile review: the mail was sent inside the request, so a slow mail server made the
    answer for an address with an account slower than for one without, telling them apart."""
    owner.email = "owner@example.com"
    owner.save()
    settings.EMAIL_BACKEND = f"{__name__}.HeldMailServer"
    HeldMailServer.release.clear()
    HeldMailServer.sending.clear()
    try:
        response = Client().post("/accounts/password_reset/", {"email": "owner@example.com"})
        # Answered while the mail server still holds the mail.
        assert response.status_code == 302
        assert HeldMailServer.sending.wait(10)
        assert mail.outbox == []
    finally:
        HeldMailServer.release.set()
    assert finish_sending_mail(10)
    assert [m.to for m in mail.outbox] == [["owner@example.com"]]


def test_signup_takes_an_optional_email_for_resets() -> None:
    for name, email in (("with-mail", "a@example.com"), ("without-mail", "")):
        Client().post(
            "/accounts/signup/",
            {"username": name, "email": email, "password1": NEW, "password2": NEW},
        )
    users = get_user_model().objects
    assert users.get(username="with-mail").email == "a@example.com"
    assert users.get(username="without-mail").email == ""


def email_setting(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("EMAIL_", "DJANGO_"))}
    environment.update(DJANGO_SETTINGS_MODULE="chatsite.settings", DJANGO_DEBUG="1", **env)
    code = "from django.conf import settings; print(settings.EMAIL_BACKEND, settings.EMAIL_PORT)"
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_mail_goes_to_the_console_unless_an_smtp_host_is_set() -> None:
    assert email_setting() == "django.core.mail.backends.console.EmailBackend 587"
    assert (
        email_setting(EMAIL_HOST="smtp.example.com", EMAIL_PORT="465")
        == "django.core.mail.backends.smtp.EmailBackend 465"
    )


@pytest.mark.redis
def test_the_reset_form_cannot_flood_a_mailbox(
    owner: Any, settings: Any, redis_prefix: str
) -> None:
    """Hostile review: the form sent a mail per POST, 120 a minute from each client address
    (CHAT_HTTP_RATE_LIMIT), to anyone's mailbox. Now at most the per-address rate, however
    the address is spelled and wherever the requests come from; the page never changes.
    (Redis: the test client runs each throttle call on a loop of its own, which the
    in-process storage does not outlive; under daphne it is the server's one loop.)"""
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.CHAT_PASSWORD_RESET_RATE_PER_EMAIL = "3/hour"
    owner.email = "owner@example.com"
    owner.save()
    spellings = ("owner@example.com", "OWNER@example.com", "Owner@Example.COM ")
    for n in range(12):
        response = Client(REMOTE_ADDR=f"198.51.100.{n + 1}").post(
            "/accounts/password_reset/", {"email": spellings[n % 3]}
        )
        assert response.status_code == 302
        assert response["Location"] == "/accounts/password_reset/done/"
    assert finish_sending_mail(10)
    assert len(mail.outbox) == 3
    assert {tuple(m.to) for m in mail.outbox} == {("owner@example.com",)}
    # Another address still gets its mail: the limit is per recipient.
    other = get_user_model().objects.create_user("second", "second@example.com", "x-pass-98765")
    Client().post("/accounts/password_reset/", {"email": other.email})
    assert finish_sending_mail(10)
    assert len(mail.outbox) == 4 and mail.outbox[-1].to == ["second@example.com"]
