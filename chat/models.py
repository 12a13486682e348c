"""The chat's data: conversations and messages, plans and quotas, model tiers and device rules."""

from __future__ import annotations

import uuid
from datetime import date

from django.conf import settings
from django.db import models
from django.urls import reverse


class Tier(models.TextChoices):
    FULL = "full", "Full"
    LITE = "lite", "Lite"


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, default="New chat")
    pinned = models.BooleanField(default=False)
    # The last message of the branch on show: edits and regenerations fork the conversation
    # into a tree of messages, and this picks the path through it (None = the newest message).
    leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-pinned", "-updated_at"]
        indexes = [models.Index(fields=["user", "-updated_at"])]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return reverse("chat:conversation", args=[self.id])

    @property
    def shard(self) -> str:
        """Two hex digits that partition the stream log; stable for the conversation's life."""
        return f"{self.id.int % 100:02d}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Status(models.TextChoices):
        STREAMING = "streaming", "Streaming"
        COMPLETE = "complete", "Complete"
        STOPPED = "stopped", "Stopped"
        FAILED = "failed", "Failed"

    # The id of ARCHITECTURE §4 (`<unix-ms>-<instance>-<shard>`): sortable, unique per instance.
    mid = models.CharField(max_length=80, unique=True)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    # The message this one follows; siblings (same parent, same role) are versions of a turn.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    text = models.TextField(blank=True, default="")
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.COMPLETE, db_index=True
    )
    error = models.CharField(max_length=300, blank=True, default="")
    model = models.CharField(max_length=120, blank=True, default="")
    tier = models.CharField(max_length=8, choices=Tier.choices, blank=True, default="")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    usage_estimated = models.BooleanField(
        default=False, help_text="The upstream sent no usage; the counts are estimates."
    )
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    chunk_count = models.PositiveIntegerField(default=0)
    # Which instance runs the turn and until when its lease holds: a turn whose lease ran
    # out belongs to a dead instance and is marked failed (see services.reap_orphans).
    owner = models.CharField(max_length=80, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["conversation", "created_at"])]

    def __str__(self) -> str:
        return f"{self.role} {self.mid}"

    @property
    def is_streaming(self) -> bool:
        return self.status == self.Status.STREAMING


class ModelTier(models.Model):
    """Which upstream model serves a tier; edited in the admin, read on each new connection."""

    tier = models.CharField(max_length=8, choices=Tier.choices, unique=True)
    model = models.CharField(max_length=120)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    temperature = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["tier"]

    def __str__(self) -> str:
        return f"{self.tier} → {self.model}"


class DeviceRule(models.Model):
    """One ordered rule of the tier policy: the first enabled rule that matches decides."""

    class Signal(models.TextChoices):
        DEVICE = "device", "Device class (phone / tablet / desktop / bot)"
        CH_MOBILE = "ch_mobile", "Client hint Sec-CH-UA-Mobile (?1 / ?0)"
        SAVE_DATA = "save_data", "Client hint Save-Data (on)"
        ECT = "ect", "Client hint ECT (slow-2g / 2g / 3g / 4g)"

    order = models.PositiveIntegerField(default=100)
    signal = models.CharField(max_length=16, choices=Signal.choices)
    value = models.CharField(max_length=40, help_text="Value to match, e.g. phone, ?1, on, 2g")
    tier = models.CharField(max_length=8, choices=Tier.choices)
    enabled = models.BooleanField(default=True)
    note = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["order", "id"]

    def __str__(self) -> str:
        return f"{self.signal}={self.value} → {self.tier}"


class Plan(models.Model):
    """Limits for a group of users; empty fields fall back to the CHAT_* settings."""

    name = models.CharField(max_length=80, unique=True)
    rate_limit = models.CharField(
        max_length=120, blank=True, default="", help_text="limits notation, e.g. 20/minute;500/day"
    )
    daily_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_streams = models.PositiveIntegerField(null=True, blank=True)
    allow_full_on_mobile = models.BooleanField(
        default=False, help_text="Users may choose the full model on phones and data-saver."
    )
    is_default = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Quota(models.Model):
    """A user's plan and personal overrides (blank = take the plan's value)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quota"
    )
    plan = models.ForeignKey(Plan, null=True, blank=True, on_delete=models.SET_NULL)
    rate_limit = models.CharField(max_length=120, blank=True, default="")
    daily_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_streams = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"quota of {self.user}"


class Usage(models.Model):
    """What one user used on one day with one model; the admin's charts sum these rows."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    day = models.DateField(default=date.today, db_index=True)
    model = models.CharField(max_length=120)
    tier = models.CharField(max_length=8, choices=Tier.choices)
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "day", "model", "tier"], name="usage_per_day")
        ]
        ordering = ["-day"]

    def __str__(self) -> str:
        return f"{self.user} {self.day} {self.model}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
