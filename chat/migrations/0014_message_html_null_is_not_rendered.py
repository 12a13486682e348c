"""Message.html: NULL means "not rendered", so "" can mean "rendered, and empty".

Before, "" meant both: an answer whose HTML came out empty (e.g. markdown made only of link
reference definitions) was rendered again on every page load. Every "" row becomes NULL except
a finished answer with no text, whose rendering is "" (chat.fragments.answer_html): prompts and
streaming answers were never rendered, and an answer with a text and no HTML was not rendered
(saved before its HTML was stored, or its rendering failed) or rendered to nothing; either way
it is rendered once more when shown, and that time stored.
"""

from django.db import migrations, models
from django.db.models import Q


def empty_to_null(apps, schema_editor):  # type: ignore[no-untyped-def]
    Message = apps.get_model("chat", "Message")
    rendered_empty = Q(role="assistant", text="") & ~Q(status="streaming")
    Message.objects.filter(html="").exclude(rendered_empty).update(html=None)


def null_to_empty(apps, schema_editor):  # type: ignore[no-untyped-def]
    Message = apps.get_model("chat", "Message")
    Message.objects.filter(html__isnull=True).update(html="")


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0013_message_picked"),
    ]

    operations = [
        migrations.AlterField(
            model_name="message",
            name="html",
            field=models.TextField(blank=True, default=None, null=True),
        ),
        migrations.RunPython(empty_to_null, null_to_empty),
    ]
