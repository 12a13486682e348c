"""The chat's data: conversations and messages, plans and quotas, model tiers and device rules."""

from __future__ import annotations

import uuid
from datetime import date
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.urls import reverse
from limits import parse_many

RATE_LIMIT_HELP = (
    "Messages allowed per time: a number, '/' or 'per', and second, minute, hour or day; "
    "several separated by ';', e.g. 20/minute;500/day. Blank: from the plan, else the "
    "CHAT_RATE_LIMIT setting."
)


def rate_limit_problem(rate: str) -> str | None:
    """Why the limiter could not enforce `rate` (None: it can, or it is blank).

    The same parser as the limiter's (`limits.parse_many`, chat.limits.rates): a rate it
    cannot read would be skipped at runtime, i.e. not enforced at all.
    """
    if not rate.strip():
        return None
    try:
        items = parse_many(rate)
    except ValueError:
        return (
            f"“{rate}” is not a rate limit the limiter can read. Write a number, '/' or "
            "'per', and a second, minute, hour or day, e.g. 20/minute or 20 per minute; "
            "several separated by ';', e.g. 20/minute;500/day."
        )
    if any(item.amount < 1 for item in items):
        return (
            f"“{rate}” allows no message at all. To keep a user out, make the account "
            "inactive; to lift the limit, use a large number."
        )
    return None


def check_rate_limit(rate: str) -> None:
    """Refuse (as the `rate_limit` field's error) a rate the limiter could not enforce."""
    problem = rate_limit_problem(rate)
    if problem:
        raise ValidationError({"rate_limit": problem})


class Tier(models.TextChoices):
    FULL = "full", "Full"
    LITE = "lite", "Lite"


# The `error` of an answer the model ended at its length limit (finish_reason "length"): the
# answer is complete as far as it goes, and it can be continued.
LENGTH_LIMITED = "The answer reached the model's length limit."


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, default="New chat")
    pinned = models.BooleanField(default=False)
    # The model picked for this conversation (blank: the device tier's default), its own
    # system prompt (sent after the user's custom instructions), and whether its title was
    # set by hand (a generated title never replaces a title the user typed).
    model = models.CharField(max_length=120, blank=True, default="")
    system_prompt = models.TextField(blank=True, default="")
    title_by_hand = models.BooleanField(default=False)
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
    # A finished answer as sanitised HTML, rendered once when it ended (by the turn, or by the
    # reaper for an answer whose turn died): resumes, page loads and other tabs serve it as it
    # is instead of rendering the markdown again. NULL: not rendered (a prompt, an answer still
    # streaming, or one whose rendering failed), so it is rendered when first shown and stored
    # then. "" is an answer rendered to nothing (e.g. only link reference definitions): shown
    # as it is, never rendered again (issue 19's review, finding 1).
    # Two "no HTML"s must differ here, so NULL is meant (DJ001 asks for one empty value).
    html = models.TextField(null=True, blank=True, default=None)  # noqa: DJ001
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.COMPLETE, db_index=True
    )
    error = models.CharField(max_length=300, blank=True, default="")
    model = models.CharField(max_length=120, blank=True, default="")
    tier = models.CharField(max_length=8, choices=Tier.choices, blank=True, default="")
    # The model was picked in the composer rather than being the device tier's default: the
    # answer's details then say "picked", as the tier did not choose the model.
    picked = models.BooleanField(
        default=False, help_text="Its model was picked, not the device tier's default."
    )
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
    # What the limiter holds for the turn (its stream slot, the day and the tokens reserved,
    # and the prompt's estimated tokens), kept so that whoever marks the answer failed after
    # its process died can release them (chat.turns.reaper). None: nothing to release.
    admission = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["conversation", "created_at"]),
            # The first prompt's versions (parent IS NULL) without reading the whole
            # conversation (chat/branches.py, issue 13 finding 17).
            models.Index(fields=["conversation", "parent"], name="chat_message_conv_parent"),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.mid}"

    @property
    def is_streaming(self) -> bool:
        return self.status == self.Status.STREAMING

    @property
    def continuable(self) -> bool:
        """Whether Continue can go on with this answer: stopped, cut (failed with some text),
        or ended at the model's length limit."""
        if self.role != self.Role.ASSISTANT:
            return False
        if self.status == self.Status.STOPPED:
            return True
        if self.status == self.Status.FAILED:
            return bool(self.text)
        return self.status == self.Status.COMPLETE and self.error == LENGTH_LIMITED


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


class PickableModel(models.Model):
    """A model users may pick in the composer, besides their device tier's default.

    Offered to users of the listed plans (none listed: every plan), and on phones (the lite
    tier's devices) only when `phones` is set.
    """

    model = models.CharField(max_length=120, unique=True, help_text="The name the upstream knows.")
    label = models.CharField(max_length=80, help_text="What users see in the picker.")
    plans: models.ManyToManyField[Plan, Any] = models.ManyToManyField(
        "Plan", blank=True, help_text="Plans that may pick it; none selected: every plan."
    )
    phones = models.BooleanField(
        default=False, help_text="Offered on phones and data-saver connections too."
    )
    enabled = models.BooleanField(default=True)
    order = models.PositiveIntegerField(default=100)

    class Meta:
        ordering = ["order", "model"]

    def __str__(self) -> str:
        return f"{self.label} ({self.model})"


class Preferences(models.Model):
    """A user's own settings: custom instructions sent with every conversation."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="preferences"
    )
    instructions = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "preferences"

    def __str__(self) -> str:
        return f"preferences of {self.user}"


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
    rate_limit = models.CharField(max_length=120, blank=True, default="", help_text=RATE_LIMIT_HELP)
    daily_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Tokens (prompt and answer) a user may spend per UTC day; 0 = unlimited. "
        "Blank: the CHAT_DAILY_TOKENS setting.",
    )
    max_concurrent_streams = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Answers a user may have streaming at once. Blank: the "
        "CHAT_MAX_CONCURRENT_STREAMS setting.",
    )
    allow_full_on_mobile = models.BooleanField(
        default=False, help_text="Users may choose the full model on phones and data-saver."
    )
    # Device tiers are advisory (the browser says what it is, and can lie): a plan that must
    # never get the full model says so here, and the server holds to it whatever the device.
    full_model_allowed = models.BooleanField(
        default=True,
        verbose_name="full model allowed",
        help_text=(
            "Off: this plan's users are always answered by the lite model, on every device, "
            "whatever their browser says (checked on the server as each answer starts)."
        ),
    )
    is_default = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        super().clean()
        check_rate_limit(self.rate_limit)


class Quota(models.Model):
    """A user's plan and personal overrides (blank = take the plan's value)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quota"
    )
    plan = models.ForeignKey(
        Plan,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="Blank: the default plan.",
    )
    rate_limit = models.CharField(
        max_length=120,
        blank=True,
        default="",
        help_text=RATE_LIMIT_HELP.replace("from the plan", "the plan's"),
    )
    daily_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Tokens per UTC day for this user only; 0 = unlimited. Blank: the plan's.",
    )
    max_concurrent_streams = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Answers streaming at once for this user only. Blank: the plan's.",
    )

    def __str__(self) -> str:
        return f"quota of {self.user}"

    def clean(self) -> None:
        super().clean()
        check_rate_limit(self.rate_limit)


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


class UsageReset(models.Model):
    """An admin's "reset today's token usage": the tokens of the day's Usage history it
    forgave. The history and its charts stay whole; what is left today subtracts these."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    day = models.DateField(db_index=True)
    tokens = models.PositiveBigIntegerField(
        help_text="Tokens of the day's usage history forgiven by this reset."
    )
    reset_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"reset of {self.user} on {self.day}"


class Feedback(models.Model):
    """A person's 👍 or 👎 on an answer (one per person and answer, changeable), with what they
    said was wrong; admins read these per model and tier to judge the models they offer."""

    class Vote(models.TextChoices):
        UP = "up", "👍 Good"
        DOWN = "down", "👎 Bad"

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="feedback")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    vote = models.CharField(max_length=4, choices=Vote.choices)
    comment = models.TextField(blank=True, default="", max_length=2000)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "user"], name="one_vote_per_answer")
        ]
        ordering = ["-updated_at"]
        verbose_name_plural = "feedback"

    def __str__(self) -> str:
        return f"{self.get_vote_display()} on {self.message.mid}"


class SharedConversation(models.Model):
    """A read-only snapshot of a conversation's branch on show, readable by anyone with its
    link (`/s/<token>/`). Sharing again updates the snapshot under the same link; unsharing
    deletes it, and the link is then not found."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, related_name="share"
    )
    # secrets.token_urlsafe(32): 256 random bits, so links cannot be guessed or enumerated.
    token = models.CharField(max_length=64, unique=True)
    title = models.CharField(max_length=200)
    # The branch as it was shared: role, text, the answer's stored sanitised HTML, model, tier,
    # status and time of each message (chat/sharing.py: snapshot_of).
    messages = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"share of {self.title}"
