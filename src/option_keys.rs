//! What every table of option keys shares (the load options' and the generation options'):
//! how one key's spellings compare, the nearest known key to a misspelt one, and the doc
//! comments of the TypeScript interfaces generated from the tables.

/// A camelCase `name` as lowercase words joined by `sep` (`kvCache` → `kv_cache`, `kv-cache`).
pub fn words(name: &str, sep: char) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push(sep);
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// `s` without case, `_` or `-`: the form every spelling of a key shares (`kvCache`,
/// `kv_cache`, `--kv-cache` and `KV-CACHE` are one key).
pub fn normalized(s: &str) -> String {
    s.trim_start_matches('-')
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Of `forms` (each a spelling and the name of the key it spells), the key whose spelling is
/// nearest to `spelled` by edit distance over the normalized forms, when it is near enough to
/// be what was meant: at most a third of the word's letters, and at least 2 (`kvCahce` →
/// `kvCache`, not `name` → `kvCache`).
pub fn nearest<'a>(
    spelled: &str,
    forms: impl IntoIterator<Item = (&'a str, &'static str)>,
) -> Option<&'static str> {
    let n = normalized(spelled);
    let mut best: Option<(usize, &'static str)> = None;
    for (form, name) in forms {
        let d = strsim::damerau_levenshtein(&n, &normalized(form));
        if best.is_none_or(|(b, _)| d < b) {
            best = Some((d, name));
        }
    }
    best.filter(|(d, _)| *d <= (n.chars().count() / 3).max(2))
        .map(|(_, name)| name)
}

/// `text` as a TypeScript doc comment indented by `indent`, wrapped at 100 columns.
pub fn doc_comment(text: &str, indent: &str) -> String {
    let one = format!("{indent}/** {text} */\n");
    if one.len() <= 101 {
        return one;
    }
    let width = 100 - indent.len() - 3;
    let mut out = format!("{indent}/**\n");
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out.push_str(&format!("{indent} * {line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&format!("{indent} * {line}\n{indent} */\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_meet_in_one_form() {
        assert_eq!(words("kvCacheBudget", '_'), "kv_cache_budget");
        for s in ["kvCache", "kv_cache", "--kv-cache", "KV-CACHE"] {
            assert_eq!(normalized(s), "kvcache", "{s}");
        }
        let forms = [("kvCache", "kvCache"), ("name", "name"), ("topK", "topK")];
        assert_eq!(nearest("kvCahce", forms), Some("kvCache"));
        assert_eq!(nearest("zzzzzzzz", forms), None);
    }

    #[test]
    fn long_doc_comments_wrap_within_100_columns() {
        let text = "word ".repeat(60);
        let doc = doc_comment(text.trim(), "  ");
        assert!(doc.lines().all(|l| l.len() <= 100), "{doc}");
        assert!(doc.starts_with("  /**\n"));
        assert_eq!(doc_comment("short", ""), "/** short */\n");
    }
}
