"""URLs of the chat app (the contract ones are in docs/protocol.md)."""

from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy

from chat import accounts, feedback, settings_views, sharing, views, webapp
from chat.forms import ChangePasswordForm, NewPasswordForm
from chat.ops import health, metrics_view

app_name = "chat"
urlpatterns = [
    path("", views.home, name="home"),
    path("c/<uuid:conversation_id>/", views.conversation, name="conversation"),
    path(
        "c/<uuid:conversation_id>/settings/",
        settings_views.conversation_settings,
        name="conversation_settings",
    ),
    path(
        "c/<uuid:conversation_id>/model/",
        settings_views.conversation_model,
        name="conversation_model",
    ),
    path("settings/", settings_views.user_settings, name="settings"),
    path("c/<uuid:conversation_id>/messages/", views.earlier_messages, name="earlier"),
    path("c/<uuid:conversation_id>/rename/", views.rename, name="rename"),
    path("c/<uuid:conversation_id>/delete/", views.delete, name="delete"),
    path("c/<uuid:conversation_id>/pin/", views.pin, name="pin"),
    path(
        "c/<uuid:conversation_id>/versions/<str:mid>/",
        views.switch_version,
        name="switch_version",
    ),
    path("c/<uuid:conversation_id>/export.md", sharing.export_markdown, name="export_markdown"),
    path("c/<uuid:conversation_id>/export.json", sharing.export_json, name="export_json"),
    path("c/<uuid:conversation_id>/share/", sharing.share, name="share"),
    path("c/<uuid:conversation_id>/unshare/", sharing.unshare, name="unshare"),
    path("s/<str:token>/", sharing.shared, name="shared"),
    path("settings/export.json", sharing.export_account, name="export_account"),
    path("m/<str:mid>/feedback/", feedback.feedback, name="feedback"),
    path("conversations/", views.conversation_list, name="conversation_list"),
    path("tier/", views.choose_tier, name="choose_tier"),
    path("accounts/signup/", accounts.signup, name="signup"),
    path("accounts/login/", accounts.LoginView.as_view(), name="login"),
    path("accounts/logout/", accounts.LogoutView.as_view(), name="logout"),
    # Password change and reset: Django's own views (templates/registration/), our URL names.
    path(
        "accounts/password_change/",
        auth_views.PasswordChangeView.as_view(
            form_class=ChangePasswordForm, success_url=reverse_lazy("chat:password_change_done")
        ),
        name="password_change",
    ),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path(
        "accounts/password_reset/",
        accounts.PasswordResetView.as_view(success_url=reverse_lazy("chat:password_reset_done")),
        name="password_reset",
    ),
    path(
        "accounts/password_reset/done/",
        auth_views.PasswordResetDoneView.as_view(),
        name="password_reset_done",
    ),
    path(
        "accounts/reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(
            form_class=NewPasswordForm, success_url=reverse_lazy("chat:password_reset_complete")
        ),
        name="password_reset_confirm",
    ),
    path(
        "accounts/reset/done/",
        auth_views.PasswordResetCompleteView.as_view(),
        name="password_reset_complete",
    ),
    path("manifest.webmanifest", webapp.manifest, name="manifest"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_view.metrics_view, name="metrics"),
]
