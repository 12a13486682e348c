"""URLs of the chat app (the contract ones are in docs/protocol.md)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from chat import health, metrics, views

app_name = "chat"
urlpatterns = [
    path("", views.home, name="home"),
    path("c/<uuid:conversation_id>/", views.conversation, name="conversation"),
    path("c/<uuid:conversation_id>/rename/", views.rename, name="rename"),
    path("c/<uuid:conversation_id>/delete/", views.delete, name="delete"),
    path("c/<uuid:conversation_id>/pin/", views.pin, name="pin"),
    path(
        "c/<uuid:conversation_id>/versions/<str:mid>/",
        views.switch_version,
        name="switch_version",
    ),
    path("conversations/", views.conversation_list, name="conversation_list"),
    path("tier/", views.choose_tier, name="choose_tier"),
    path("accounts/signup/", views.signup, name="signup"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
