"""App configuration for chat."""

from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connect the receivers that drop cached policies and limits when an admin edits them.
        from chat import ratelimit, signals, tiers  # noqa: F401
