// Tags filters (the runs and jobs pages): the text of a tags field, and a
// tag written into it.

// tagList splits a tags field's text into the API's repeated ?tag=
// parameters. Tags are comma-separated; a tag holding a comma or a double
// quote, or starting or ending with a space, is written in double quotes
// with its quotes doubled ("ship:1,2"), as tagText writes it.
export const tagList = (v) => {
  const tags = [];
  let i = 0;
  while (i < v.length) {
    while (v[i] === ' ') i++;
    let t = '';
    if (v[i] === '"') {
      for (i++; i < v.length; i++) {
        if (v[i] === '"' && v[i + 1] === '"') { t += '"'; i++; } else if (v[i] === '"') { i++; break; } else t += v[i];
      }
      while (i < v.length && v[i] !== ',') i++; // text after the closing quote is ignored
    } else {
      const end = v.indexOf(',', i);
      t = v.slice(i, end < 0 ? v.length : end).trim();
      i = end < 0 ? v.length : end;
    }
    if (t) tags.push(t);
    i++; // the comma
  }
  return tags;
};

// tagText is tag t as the filter's text writes it (see tagList).
export const tagText = (t) => (/[",]/.test(t) || t !== t.trim() ? '"' + t.replaceAll('"', '""') + '"' : t);
