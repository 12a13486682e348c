// The conversation list's date groups, as in ChatGPT: Pinned, Today, Yesterday, Previous 7
// days, Previous 30 days, then one group per month. Pure logic here (the label of a date);
// sidebar.js puts the headings in the list, in the browser's own time zone.

export const PINNED = "Pinned";

const MONTH = new Intl.DateTimeFormat("en", { month: "long" });
const MONTH_YEAR = new Intl.DateTimeFormat("en", { month: "long", year: "numeric" });

/** Whole calendar days from `date` to `now`, in local time (a DST day still counts as one). */
export function daysBetween(date, now) {
  const start = (d) => new Date(d.getFullYear(), d.getMonth(), d.getDate());
  return Math.round((start(now) - start(date)) / 86_400_000);
}

/**
 * The group a conversation belongs to, from when it was last written to.
 * @param {Date} updated
 * @param {Date} now
 * @param {boolean} pinned
 */
export function groupLabel(updated, now, pinned = false) {
  if (pinned) return PINNED;
  if (Number.isNaN(updated.getTime())) return "Older";
  const days = daysBetween(updated, now);
  if (days <= 0) return "Today"; // (a clock a little ahead of ours is still today)
  if (days === 1) return "Yesterday";
  if (days <= 7) return "Previous 7 days";
  if (days <= 30) return "Previous 30 days";
  return updated.getFullYear() === now.getFullYear()
    ? MONTH.format(updated)
    : MONTH_YEAR.format(updated);
}
