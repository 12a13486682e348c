"""Forms: signup, setting a new password, renaming a conversation, and the conversation list's
search and paging."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm, UserCreationForm
from django.contrib.auth.models import User
from django.core.exceptions import BadRequest


class SignupForm(UserCreationForm):
    # Optional: only for resetting a forgotten password (Django's password reset by email).
    email = forms.EmailField(
        required=False,
        label="Email (optional)",
        help_text="Only used to reset your password if you forget it.",
    )

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def validate_password_for_user(self, user: User, **kwargs: object) -> None:
        """Django files a weak password's error (too short, too common, too like the username)
        under the confirmation; it is the password that is weak, so it goes under Password."""
        kwargs.setdefault("password_field_name", "password1")
        # Django 5.1's SetPasswordMixin hook, which django-stubs does not declare yet.
        super().validate_password_for_user(user, **kwargs)  # type: ignore[misc]


class ChangePasswordForm(PasswordChangeForm):
    """Django's password change, with a weak new password's error under New password (where it
    was typed), as signup does, not under its confirmation. Django's clean() passes the field
    name positionally: whatever it passes, the error goes to the first field."""

    def validate_password_for_user(self, user: User, *args: object, **kwargs: object) -> None:
        super().validate_password_for_user(user, password_field_name="new_password1")


class NewPasswordForm(SetPasswordForm):
    """Django's new password from a reset link, its weak password's error placed the same way."""

    def validate_password_for_user(self, user: User, *args: object, **kwargs: object) -> None:
        super().validate_password_for_user(user, password_field_name="new_password1")


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200, strip=True)


class InvalidInput(BadRequest):
    """Input a person sent that we refuse, raised anywhere on the HTTP path: its message is
    ours and fit to show them (chatsite.urls routes it to chat.views.bad_request: a 400)."""


def current_conversation(value: str) -> str:
    """The `current` a sidebar request sends (the id of the conversation its page shows, or
    ""), as the sidebar writes it back. Only an id: the sidebar repeats it in three fields of
    every entry, so any other text would come back fifty-fold or more (a hostile review sent
    200 KB of quotes and got 21.6 MB)."""
    if not value:
        return ""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidInput("The current conversation must be a conversation's id.") from None


# Far past any real list, and inside every database's integer range (a 30-digit offset made
# PostgreSQL and SQLite fail the query).
MAX_LIST_OFFSET = 1_000_000


class ListQueryForm(forms.Form):
    """The conversation list's query string: `q` (search), `offset` (paging), `current`."""

    q = forms.CharField(
        required=False,
        max_length=200,
        error_messages={"max_length": "Search for at most 200 characters."},
    )
    offset = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_LIST_OFFSET,
        error_messages={
            "invalid": "The list's offset must be a whole number.",
            "min_value": "The list's offset cannot be negative.",
            "max_value": f"The list's offset can be at most {MAX_LIST_OFFSET:,}.",
        },
    )
    current = forms.CharField(required=False, max_length=80)

    def first_error(self) -> str:
        return str(next(iter(self.errors.values()))[0])


# Sent with every prompt of every conversation, so kept short enough to leave the model room.
MAX_INSTRUCTIONS_CHARS = 4000


class InstructionsForm(forms.Form):
    """The user's custom instructions (GET/POST /settings/)."""

    instructions = forms.CharField(
        required=False,
        max_length=MAX_INSTRUCTIONS_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 8}),
        label="Custom instructions",
        help_text="Sent to the model at the start of every conversation, before the "
        "conversation's own system prompt.",
    )


class SystemPromptForm(forms.Form):
    """A conversation's own system prompt (POST /c/<id>/settings/)."""

    system_prompt = forms.CharField(
        required=False,
        max_length=MAX_INSTRUCTIONS_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 4}),
        label="System prompt for this conversation",
    )


class EarlierForm(forms.Form):
    """The query string of "Load earlier messages": `before`, the first message shown."""

    before = forms.CharField(
        max_length=80,
        error_messages={
            "required": "Say which message to load the messages before (before=<message id>).",
            "max_length": "That is not a message id.",
        },
    )

    def first_error(self) -> str:
        return str(next(iter(self.errors.values()))[0])
