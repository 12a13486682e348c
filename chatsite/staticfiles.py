"""Static files with content hashes in their names, ES module imports included (production)."""

from __future__ import annotations

from django.contrib.staticfiles.storage import ManifestStaticFilesStorage


class HashedStaticFilesStorage(ManifestStaticFilesStorage):
    """`chat.<hash>.css`, `stream.<hash>.js`: a changed file gets a new URL, so nginx can let
    browsers cache every file for a year (deploy/nginx.conf).

    stream.js imports its siblings as ES modules (`import … from "./reorder.js"`); rewriting
    those imports too keeps an old cached module from meeting a new one after an upgrade.
    """

    support_js_module_import_aggregation = True
