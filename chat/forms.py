"""Forms: signup and renaming a conversation."""

from __future__ import annotations

from django import forms
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import User


class SignupForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username",)


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200, strip=True)
