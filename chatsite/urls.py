"""URL configuration: the chat, accounts and the admin."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]

# A 400 says what was wrong (chat.forms.InvalidInput), in the page or in htmx's alert region.
handler400 = "chat.views.bad_request"
