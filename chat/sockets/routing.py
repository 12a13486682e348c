"""Websocket URL routes."""

from django.urls import path

from chat.sockets.consumers import ChatConsumer

websocket_urlpatterns = [path("ws/chat/", ChatConsumer.as_asgi())]
