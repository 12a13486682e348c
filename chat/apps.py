"""App configuration for chat, and the admin's (whose default site is ours)."""

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connect the receivers (logout closes sockets, admin edits drop cached policies).
        from chat import signals  # noqa: F401  (receivers connect when imported)


class ChatAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with chat.admin_site.ChatAdminSite as `admin.site`; named in
    INSTALLED_APPS in place of django.contrib.admin."""

    default = False  # ChatConfig stays this module's default app config
    default_site = "chat.admin_site.ChatAdminSite"
