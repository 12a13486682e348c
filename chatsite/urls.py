"""URL configuration: the chat, accounts and the admin."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]

# A 400 says what was wrong (chat.forms.InvalidInput), in the page or in htmx's alert region.
handler400 = "chat.views.bad_request"
# A 404 in the app's own page with the way back (DEBUG shows Django's technical page instead).
handler404 = "chat.views.not_found"
