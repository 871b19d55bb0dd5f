//! envoyproxy/ratelimit's configuration files, loaded unchanged, plus
//! tollgate's extensions; and which rules a request's descriptor matches.
//!
//! # Files
//!
//! A configuration is a directory of YAML files, one domain each
//! ([`Config::load_dir`]), or the same files given as text
//! ([`Config::from_files`]). The format is envoyproxy/ratelimit's:
//!
//! ```yaml
//! domain: messaging              # unique across the files
//! descriptors:
//!   - key: message_type          # required
//!     value: marketing           # optional; `*` in it is a wildcard
//!     descriptors:               # nested descriptors: a longer descriptor
//!       - key: to_number
//!         rate_limit:
//!           unit: day            # second, minute, hour, day, week, month, year
//!           requests_per_unit: 5
//!   - key: to_number
//!     rate_limit:
//!       name: per_number         # optional: for `replaces`
//!       replaces: [{name: other}]
//!       unit: day
//!       requests_per_unit: 100
//!     shadow_mode: false         # count, but never refuse
//!     detailed_metric: false     # stat name with the request's values
//!     value_to_metric: false     # stat name with this entry's value
//!     share_threshold: false     # wildcard values share one limit
//!     quota_mode: false
//!     metadata: {any: thing}     # returned with the match
//! ```
//!
//! with envoyproxy's checks: a domain and every key must be non-empty, a
//! domain appears in one file only, a key and value appear once in each
//! list, the unit is one of the seven (any case), `unlimited: true` takes no
//! unit, `replaces` entries are non-empty and do not name their own rule, and
//! `share_threshold` needs a wildcard value. Unknown fields are refused. Every
//! refusal is a [`ConfigFileError`] with the file, the line and column, and
//! the reason:
//!
//! ```
//! use tollgate_server::config::Config;
//!
//! let text = "\
//! domain: mongo_cps
//! descriptors:
//!   - key: database
//!     value: users
//!     rate_limit:
//!       unit: second
//!       requests_per_uint: 500
//! ";
//! let err = Config::from_files([("mongo.yaml", text)]).unwrap_err();
//! assert_eq!((err.line, err.column), (Some(7), Some(7)));
//! assert!(err.to_string().starts_with("mongo.yaml:7:7: "));
//! assert!(err.reason.contains("unknown field `requests_per_uint`"));
//! ```
//!
//! # Matching
//!
//! A request's descriptor is a list of (key, value) entries, matched as
//! envoyproxy/ratelimit's `GetLimit` does ([`Domain::matching`]): the first
//! entry against the domain's descriptors, the second against the children of
//! the descriptor the first matched, and so on. At each level the descriptor
//! with the entry's key and exactly its value wins; else the first (in file
//! order) whose wildcard value matches it; else the one with the key and no
//! value, which matches any value. The descriptor reached by the *last* entry
//! applies if it has a rate limit; a request longer or shorter than the path
//! to a rate limit matches nothing.
//!
//! Across the descriptors of one request, a rule named in another matched
//! rule's `replaces` is dropped ([`apply_replaces`]).
//!
//! # Keys and stat names
//!
//! A match carries the key under which its limit's state is kept
//! ([`Match::key`]): the domain and every entry's key and value, where an
//! entry matched through a `share_threshold` wildcard counts as the wildcard
//! itself, so all the values it matches share one limit. Each part is
//! length-prefixed: unlike envoyproxy's keys, which join the parts with `_`,
//! two different descriptors (`("a_b", "c")` and `("a", "b_c")`) never share
//! a key. A match also carries envoyproxy's name for the limit's statistics
//! ([`Match::stat_name`]), so that dashboards built on envoyproxy's metrics
//! keep working.
//!
//! # tollgate's extensions
//!
//! Fields that no envoyproxy file has, so every existing file loads and
//! behaves as before:
//!
//! * `algorithm` in a rate limit: `fixed_window` (the default, as
//!   envoyproxy counts), `sliding_log` (exact), `sliding_window`, or
//!   `token_bucket` with an optional `burst` (by default `requests_per_unit`).
//!   `burst` is refused with any other algorithm.
//! * `rate_limits: [...]` in place of `rate_limit`: several rules on one
//!   descriptor (at most 64), each with the fields of `rate_limit`; all of
//!   them apply to a request that matches the descriptor.
//!
//! Each rate is checked as tollgate's limiters check it at construction (a
//! burst of zero, more than one request per nanosecond, a burst that takes
//! longer than 2^62 ns to refill...), and the file is refused with the core's
//! [`tollgate::ConfigError`] as the error's source.
//!
//! ```
//! use tollgate_server::config::{Algorithm, Config, Unit};
//!
//! let text = "
//! domain: api
//! descriptors:
//!   - key: user
//!     rate_limits:
//!       - unit: second
//!         requests_per_unit: 10
//!         algorithm: token_bucket
//!         burst: 20
//!       - unit: day
//!         requests_per_unit: 10000
//!         algorithm: sliding_log
//! ";
//! let config = Config::from_files([("api.yaml", text)])?;
//! let matched = config.domain("api").unwrap().matching(&[("user", "alice")]).unwrap();
//! let rules: Vec<_> = matched.in_force().collect();
//! assert_eq!(rules[0].algorithm, Algorithm::TokenBucket { burst: 20 });
//! assert_eq!(rules[1].rate(), Some(tollgate::Rate::new(10_000, Unit::Day.duration())));
//! # Ok::<(), tollgate_server::config::ConfigFileError>(())
//! ```
//!
//! # Where tollgate differs from envoyproxy/ratelimit
//!
//! * Keys and values are compared as they are; envoyproxy joins each entry's
//!   key and value with `_` before looking it up, so that the key `a_b`
//!   without a value and the key `a` with the value `b` are one descriptor to
//!   it (a duplicate), and a wildcard of one key can match another key's
//!   entries. A `*` in a key is an ordinary character.
//! * A field in the wrong place (`unit` beside `key`) is refused;
//!   envoyproxy accepts any of its field names anywhere and ignores the
//!   misplaced ones.
//! * A unit that is not one of the seven is refused even with
//!   `unlimited: true`.
//! * A file with a second, non-empty YAML document is refused; envoyproxy
//!   ignores everything after the first.
//! * YAML merge keys (`<<: *anchor`) are not supported; anchors and aliases
//!   are.
//! * Merging one domain from several files (envoyproxy's
//!   `MERGE_DOMAIN_CONFIG`) is not supported: a domain in two files is
//!   refused, envoyproxy's default.

mod names;
mod parse;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ahash::RandomState;
use tollgate::Rate;

use names::Pattern;

/// `rate_limits` entries one descriptor may have: a match keeps which of its
/// rules are replaced in one `u64`.
const MAX_RULES_PER_DESCRIPTOR: usize = 64;

/// A loaded configuration: every domain of a directory of files.
///
/// ```
/// use tollgate_server::config::Config;
///
/// let config = Config::from_files([
///     ("a.yaml", "domain: a\ndescriptors:\n  - key: k\n"),
///     ("b.yaml", "domain: b\n"),
/// ])?;
/// assert!(config.domain("a").is_some());
/// assert!(config.domain("c").is_none());
/// let names: Vec<_> = config.domains().map(|d| d.name()).collect();
/// assert_eq!(names, ["a", "b"]);
/// # Ok::<(), tollgate_server::config::ConfigFileError>(())
/// ```
#[derive(Debug)]
pub struct Config {
    /// In name order.
    domains: Vec<Domain>,
    index: HashMap<Box<str>, usize, RandomState>,
    /// A hash of the files' names and texts, in order: two loads of the same
    /// files have the same.
    sources: u64,
}

impl Config {
    /// Loads every file named `*.yaml` or `*.yml` (any case) in `dir` and its
    /// subdirectories, in path order, following links to files. Names that
    /// start with `.` are skipped, files and directories alike: a Kubernetes
    /// ConfigMap's volume links each file into a hidden `..data` directory,
    /// which would otherwise load every domain twice. Other files are
    /// ignored. (envoyproxy/ratelimit reads every file under its directory,
    /// whatever the name.)
    ///
    /// ```
    /// use tollgate_server::config::Config;
    ///
    /// let dir = std::env::temp_dir().join(format!("tollgate-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(dir.join("mongo.yaml"), "domain: mongo_cps\n").unwrap();
    /// std::fs::write(dir.join("README.md"), "not configuration").unwrap();
    /// let config = Config::load_dir(&dir)?;
    /// assert!(config.domain("mongo_cps").is_some());
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The first file that cannot be read or is refused (see the [module
    /// documentation](self)); a directory that cannot be read.
    pub fn load_dir(dir: impl AsRef<Path>) -> Result<Config, ConfigFileError> {
        let mut paths = Vec::new();
        collect_yaml_files(dir.as_ref(), &mut paths)?;
        paths.sort();
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            match fs::read_to_string(&path) {
                Ok(text) => files.push((path, text)),
                Err(error) => return Err(ConfigFileError::io(path, error)),
            }
        }
        Config::from_files(files)
    }

    /// Loads the files given as (name, text) pairs, in order: a domain that
    /// appears twice is refused in the later file. The names are only for
    /// errors.
    ///
    /// ```
    /// use tollgate_server::config::Config;
    ///
    /// let err = Config::from_files([
    ///     ("first.yaml", "domain: shop\n"),
    ///     ("second.yaml", "# again\ndomain: shop\n"),
    /// ])
    /// .unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "second.yaml:2:9: domain: duplicate domain 'shop' in config file (already in first.yaml)"
    /// );
    /// ```
    ///
    /// # Errors
    ///
    /// The first file refused (see the [module documentation](self)).
    pub fn from_files<I, P, T>(files: I) -> Result<Config, ConfigFileError>
    where
        I: IntoIterator<Item = (P, T)>,
        P: Into<PathBuf>,
        T: AsRef<str>,
    {
        let mut taken: HashMap<String, PathBuf> = HashMap::new();
        let mut domains = Vec::new();
        let mut sources = std::hash::DefaultHasher::new();
        for (file, text) in files {
            let file = file.into();
            std::hash::Hash::hash(&(&file, text.as_ref()), &mut sources);
            let parsed = {
                let ctx = parse::Ctx {
                    taken: &taken,
                    limit_error: Cell::new(None),
                };
                parse::parse_file(text.as_ref(), &ctx)
                    .map_err(|error| ConfigFileError::yaml(&file, &error, ctx.limit_error.get()))?
            };
            let Some(raw) = parsed else {
                return Err(ConfigFileError {
                    file,
                    line: None,
                    column: None,
                    reason: "config file cannot have empty domain (the file is empty)".into(),
                    source: None,
                });
            };
            taken.insert(raw.domain.clone(), file);
            domains.push(Domain::build(raw));
        }
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        let index = domains
            .iter()
            .enumerate()
            .map(|(at, domain)| (Box::from(domain.name.as_str()), at))
            .collect();
        Ok(Config {
            domains,
            index,
            sources: std::hash::Hasher::finish(&sources),
        })
    }

    /// Whether `self` was loaded from the same files, with the same texts,
    /// as `other`.
    pub(crate) fn same_sources(&self, other: &Config) -> bool {
        self.sources == other.sources
    }

    /// The domain called `name`.
    ///
    /// ```
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files([("x.yaml", "domain: x\n")])?;
    /// assert_eq!(config.domain("x").map(|d| d.name()), Some("x"));
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.index.get(name).map(|&at| &self.domains[at])
    }

    /// Every domain, in name order.
    ///
    /// ```
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files(Vec::<(String, String)>::new())?;
    /// assert_eq!(config.domains().count(), 0);
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn domains(&self) -> impl ExactSizeIterator<Item = &Domain> {
        self.domains.iter()
    }
}

fn collect_yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ConfigFileError> {
    let entries = fs::read_dir(dir).map_err(|error| ConfigFileError::io(dir.into(), error))?;
    for entry in entries {
        let entry = entry.map_err(|error| ConfigFileError::io(dir.into(), error))?;
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|error| ConfigFileError::io(path.clone(), error))?;
        if kind.is_dir() {
            collect_yaml_files(&path, out)?;
            continue;
        }
        let yaml = path
            .extension()
            .and_then(|extension| extension.to_str())
            .is_some_and(|extension| {
                extension.eq_ignore_ascii_case("yaml") || extension.eq_ignore_ascii_case("yml")
            });
        if !yaml {
            continue;
        }
        let file = if kind.is_symlink() {
            fs::metadata(&path)
                .map_err(|error| ConfigFileError::io(path.clone(), error))?
                .is_file()
        } else {
            kind.is_file()
        };
        if file {
            out.push(path);
        }
    }
    Ok(())
}

/// One domain's descriptors, ready to match requests against.
#[derive(Debug)]
pub struct Domain {
    name: String,
    /// `failure_mode`, if the file sets it.
    failure: Option<Failure>,
    root: Level,
    /// Every descriptor, parents before children, in file order.
    nodes: Vec<Node>,
}

#[derive(Debug)]
struct Node {
    children: Level,
    rules: Box<[Rule]>,
    value_to_metric: bool,
    share_threshold: bool,
    detailed_metric: bool,
    metadata: Option<BTreeMap<String, MetadataValue>>,
}

/// One list of descriptors, by key: a request entry costs one lookup of its
/// key and one of its value, and allocates nothing.
#[derive(Debug, Default)]
struct Level {
    keys: HashMap<Box<str>, Children, RandomState>,
}

#[derive(Debug, Default)]
struct Children {
    /// By value: every descriptor with a value, wildcards too (envoyproxy
    /// looks the request's value up as written before it tries wildcards).
    exact: HashMap<Box<str>, usize, RandomState>,
    /// In file order.
    wildcards: Vec<(Pattern, usize)>,
    /// The descriptor with the key and no value.
    any: Option<usize>,
}

/// How an entry matched its descriptor.
#[derive(Clone, Copy)]
enum Via<'d> {
    Value,
    Wildcard(&'d Pattern),
    Key,
}

impl Level {
    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn step(&self, key: &str, value: &str) -> Option<(usize, Via<'_>)> {
        let children = self.keys.get(key)?;
        // An empty map answers without hashing.
        if let Some(&node) = children.exact.get(value) {
            return Some((node, Via::Value));
        }
        for (pattern, node) in &children.wildcards {
            if pattern.matches(value) {
                return Some((*node, Via::Wildcard(pattern)));
            }
        }
        children.any.map(|node| (node, Via::Key))
    }
}

/// What the first walk of a request learns for the second.
struct Walked {
    node: usize,
    /// Some entry matched a `share_threshold` wildcard.
    shared: bool,
    text_bytes: usize,
}

impl Domain {
    fn build(raw: parse::RawFile) -> Domain {
        let mut nodes = Vec::new();
        let mut path = Vec::new();
        let root = build_level(&raw.domain, &mut path, raw.descriptors, &mut nodes);
        Domain {
            name: raw.domain,
            failure: raw.failure,
            root,
            nodes,
        }
    }

    /// The file's `failure_mode` (a tollgate extension): what the Redis
    /// backends answer for this domain when Redis cannot; `None` for the
    /// server's default.
    ///
    /// ```
    /// use tollgate_server::Failure;
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files([("x.yaml", "domain: x\nfailure_mode: closed\n")])?;
    /// assert_eq!(config.domain("x").unwrap().failure(), Some(Failure::Closed));
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn failure(&self) -> Option<Failure> {
        self.failure
    }

    /// The domain's name.
    ///
    /// ```
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files([("x.yaml", "domain: x\n")])?;
    /// assert_eq!(config.domains().next().unwrap().name(), "x");
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every rule of the domain, parents before children, in file order.
    /// Each carries its [`RuleId`]: comparing the rules of two loads by id
    /// tells which rules are new, gone, or changed (`Rule`'s `==` compares
    /// the whole definition).
    ///
    /// ```
    /// use tollgate_server::config::Config;
    ///
    /// let old = Config::from_files([("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")])?;
    /// let new = Config::from_files([("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9}\n")])?;
    /// let (old, new) = (old.domain("a").unwrap(), new.domain("a").unwrap());
    /// let (old, new) = (old.rules().next().unwrap(), new.rules().next().unwrap());
    /// assert_eq!(old.id, new.id);
    /// assert_ne!(old, new);
    /// assert_eq!(old.id.to_string(), "a/k#0");
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.nodes.iter().flat_map(|node| node.rules.iter())
    }

    /// The rules a request descriptor's entries match, as envoyproxy's
    /// `GetLimit` finds them (see [Matching](self#matching)), with the key
    /// their state is kept under and their stat name. `None` if no
    /// descriptor with a rate limit matches — an unknown key or value, or a
    /// list of entries longer or shorter than the path to a rate limit.
    ///
    /// It allocates the match's two strings and nothing else.
    ///
    /// ```
    /// use tollgate_server::config::Config;
    ///
    /// let text = "
    /// domain: edge_proxy_per_ip
    /// descriptors:
    ///   - key: remote_address
    ///     rate_limit:
    ///       unit: second
    ///       requests_per_unit: 10
    ///   - key: remote_address
    ///     value: 50.0.0.5
    ///     rate_limit:
    ///       unit: second
    ///       requests_per_unit: 0
    /// ";
    /// let config = Config::from_files([("edge.yaml", text)])?;
    /// let edge = config.domain("edge_proxy_per_ip").unwrap();
    ///
    /// let any = edge.matching(&[("remote_address", "50.0.0.1")]).unwrap();
    /// assert_eq!(any.rules[0].requests_per_unit, 10);
    /// assert_eq!(any.stat_name, "edge_proxy_per_ip.remote_address");
    ///
    /// let blocked = edge.matching(&[("remote_address", "50.0.0.5")]).unwrap();
    /// assert!(blocked.rules[0].blocks_all());
    /// assert_eq!(blocked.stat_name, "edge_proxy_per_ip.remote_address_50_0_0_5");
    ///
    /// assert_ne!(any.key, blocked.key);
    /// assert!(edge.matching(&[("remote_address", "1.2.3.4"), ("path", "/")]).is_none());
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn matching(&self, entries: &[(&str, &str)]) -> Option<Match<'_>> {
        let walked = self.walk(entries)?;
        let node = &self.nodes[walked.node];
        let mut key = String::with_capacity(names::key_capacity(
            &self.name,
            entries.len(),
            walked.text_bytes,
        ));
        names::push_part(&mut key, &self.name);
        let mut stat_name =
            String::with_capacity(self.name.len() + walked.text_bytes + 2 * entries.len());
        stat_name.push_str(&self.name);
        // The second walk retraces the first (it is only taken for a match)
        // and writes each entry as it goes.
        let mut level = &self.root;
        for &(entry_key, value) in entries {
            let (at, via) = level
                .step(entry_key, value)
                .expect("the first walk went this way");
            let step = &self.nodes[at];
            let shared = match via {
                Via::Wildcard(pattern) if step.share_threshold => Some(&*pattern.text),
                _ => None,
            };
            key.push(';');
            names::push_part(&mut key, entry_key);
            key.push('=');
            names::push_part(&mut key, shared.unwrap_or(value));

            stat_name.push('.');
            stat_name.push_str(entry_key);
            if node.detailed_metric && !walked.shared {
                // Every value, and the `_` even before an empty one, as
                // envoyproxy writes it.
                stat_name.push('_');
                stat_name.push_str(value);
            } else {
                let shown = if node.detailed_metric {
                    shared.unwrap_or(value)
                } else {
                    match via {
                        Via::Wildcard(_) if step.value_to_metric && shared.is_none() => value,
                        Via::Wildcard(pattern) => &pattern.text,
                        Via::Value => value,
                        Via::Key if step.value_to_metric => value,
                        Via::Key => "",
                    }
                };
                if !shown.is_empty() {
                    stat_name.push('_');
                    stat_name.push_str(shown);
                }
            }
            level = &step.children;
        }
        names::sanitize_stat_name(&mut stat_name);
        Some(Match {
            rules: &node.rules,
            key,
            stat_name,
            metadata: node.metadata.as_ref(),
            replaced: 0,
        })
    }

    /// The first walk: the descriptor reached, without writing anything.
    fn walk(&self, entries: &[(&str, &str)]) -> Option<Walked> {
        let mut level = &self.root;
        let mut walked = Walked {
            node: 0,
            shared: false,
            text_bytes: 0,
        };
        for (at, &(key, value)) in entries.iter().enumerate() {
            let (node_at, via) = level.step(key, value)?;
            let node = &self.nodes[node_at];
            walked.shared |= matches!(via, Via::Wildcard(_)) && node.share_threshold;
            walked.text_bytes += key.len() + value.len();
            if at + 1 == entries.len() {
                walked.node = node_at;
                return (!node.rules.is_empty()).then_some(walked);
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

fn build_level(
    domain: &str,
    path: &mut Vec<(String, Option<String>)>,
    descriptors: Vec<parse::RawDescriptor>,
    nodes: &mut Vec<Node>,
) -> Level {
    let mut level = Level::default();
    for descriptor in descriptors {
        path.push((descriptor.key.clone(), descriptor.value.clone()));
        let at = nodes.len();
        let rules = descriptor
            .rules
            .into_iter()
            .enumerate()
            .map(|(index, raw)| Rule {
                id: RuleId {
                    domain: domain.to_owned(),
                    path: path.clone(),
                    index,
                },
                name: raw.name,
                replaces: raw.replaces,
                unit: raw.unit,
                requests_per_unit: raw.requests_per_unit,
                unlimited: raw.unlimited,
                algorithm: raw.algorithm,
                shadow_mode: descriptor.shadow_mode,
                quota_mode: descriptor.quota_mode,
                detailed_metric: descriptor.detailed_metric,
            })
            .collect();
        nodes.push(Node {
            children: Level::default(),
            rules,
            value_to_metric: descriptor.value_to_metric,
            share_threshold: descriptor.share_threshold,
            detailed_metric: descriptor.detailed_metric,
            metadata: descriptor.metadata,
        });
        nodes[at].children = build_level(domain, path, descriptor.descriptors, nodes);
        path.pop();

        let children = level.keys.entry(descriptor.key.into()).or_default();
        match descriptor.value {
            Some(value) => {
                if value.contains('*') {
                    children.wildcards.push((Pattern::new(&value), at));
                }
                children.exact.insert(value.into(), at);
            }
            None => children.any = Some(at),
        }
    }
    level
}

/// The state key for a request descriptor that brings its own limit (the
/// `limit` field of Envoy's `RateLimitDescriptor`, which envoyproxy applies
/// without matching): `domain` and the entries as they are, in
/// [`Match::key`]'s form — the key [`Domain::matching`] gives the same
/// entries when no `share_threshold` wildcard is involved, as envoyproxy's
/// cache keys for an override and for a configured limit agree.
///
/// ```
/// use tollgate_server::config::{Config, override_key};
///
/// let config = Config::from_files([("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")])?;
/// let a = config.domain("a").unwrap();
/// assert_eq!(override_key("a", &[("k", "v")]), a.matching(&[("k", "v")]).unwrap().key);
/// # Ok::<(), tollgate_server::config::ConfigFileError>(())
/// ```
pub fn override_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let text: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
    let mut key = String::with_capacity(names::key_capacity(domain, entries.len(), text));
    names::push_part(&mut key, domain);
    for &(entry_key, value) in entries {
        key.push(';');
        names::push_part(&mut key, entry_key);
        key.push('=');
        names::push_part(&mut key, value);
    }
    key
}

/// envoyproxy's stat name for a request descriptor that brings its own
/// limit: `domain`, then each entry as `key_value` (`key` for an empty
/// value), joined by dots, sanitized as [`Match::stat_name`] is.
///
/// ```
/// use tollgate_server::config::override_stat_name;
/// assert_eq!(override_stat_name("a", &[("k", "v"), ("x", "")]), "a.k_v.x");
/// assert_eq!(override_stat_name("a", &[("ip", "10.0.0.1")]), "a.ip_10_0_0_1");
/// ```
pub fn override_stat_name(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut name = String::from(domain);
    name.push('.');
    for (at, &(key, value)) in entries.iter().enumerate() {
        if at > 0 {
            name.push('.');
        }
        name.push_str(key);
        if !value.is_empty() {
            name.push('_');
            name.push_str(value);
        }
    }
    names::sanitize_stat_name(&mut name);
    name
}

/// The rules of the descriptor a request descriptor matched, with the key
/// their state is kept under and their stat name. From
/// [`Domain::matching`].
///
/// ```
/// use tollgate_server::config::Config;
///
/// let text = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
/// let config = Config::from_files([("a.yaml", text)])?;
/// let m = config.domain("a").unwrap().matching(&[("k", "v")]).unwrap();
/// assert_eq!(m.rules[0].requests_per_unit, 5);
/// assert_eq!(m.key, "1:a;1:k=1:v");
/// assert_eq!(m.stat_name, "a.k");
/// assert_eq!(m.in_force().count(), 1);
/// # Ok::<(), tollgate_server::config::ConfigFileError>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Match<'a> {
    /// All the descriptor's rules (one for `rate_limit`, each of
    /// `rate_limits`), in file order, replaced ones too: see
    /// [`in_force`](Match::in_force).
    pub rules: &'a [Rule],
    /// The key the rules' state is kept under: the domain and each entry's
    /// key and value (a `share_threshold` wildcard in place of the value it
    /// matched), each part length-prefixed (`<bytes>:<text>`), so that no two
    /// different descriptors share a key. The rules of one match share it: a
    /// store with several rules per descriptor tells them apart by
    /// [`RuleId::index`].
    pub key: String,
    /// envoyproxy/ratelimit's name for the limit's statistics: its counters
    /// are `ratelimit.service.rate_limit.<stat_name>.total_hits` (and
    /// `.over_limit`, `.near_limit`, `.within_limit`, `.shadow_mode`). The
    /// domain, then per entry its key, with a value where the descriptor gave
    /// one (a wildcard as written), where `value_to_metric` asks for the
    /// request's, and everywhere under `detailed_metric`; a `share_threshold`
    /// wildcard always shows as written. `:` and `|` become `_`, and so do
    /// the dots of anything that looks like an IPv4 address.
    pub stat_name: String,
    /// The matched descriptor's `metadata`, if it has any.
    pub metadata: Option<&'a BTreeMap<String, MetadataValue>>,
    /// Bit `i`: `rules[i]` is replaced.
    replaced: u64,
}

impl<'a> Match<'a> {
    /// The rules in force: [`rules`](Match::rules) less those
    /// [`apply_replaces`] dropped.
    ///
    /// ```
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files([("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")])?;
    /// let m = config.domain("a").unwrap().matching(&[("k", "v")]).unwrap();
    /// assert_eq!(m.in_force().count(), 1);
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn in_force(&self) -> impl Iterator<Item = &'a Rule> + use<'a> {
        let replaced = self.replaced;
        self.rules
            .iter()
            .enumerate()
            .filter(move |&(at, _)| replaced & (1 << at) == 0)
            .map(|(_, rule)| rule)
    }

    /// Whether `rules[index]` was dropped by [`apply_replaces`].
    ///
    /// ```
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files([("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")])?;
    /// let m = config.domain("a").unwrap().matching(&[("k", "v")]).unwrap();
    /// assert!(!m.is_replaced(0));
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn is_replaced(&self, index: usize) -> bool {
        index < self.rules.len() && self.replaced & (1 << index) != 0
    }
}

/// Drops, across the matches of one request (one per descriptor, `None` for
/// a descriptor that matched nothing), every rule whose `name` appears in the
/// `replaces` of a matched rule — as envoyproxy/ratelimit does, where the
/// replacing rules are collected from every match before any is dropped, and
/// an unlimited rule is never dropped (it still answers "unlimited").
///
/// ```
/// use tollgate_server::config::{Config, apply_replaces};
///
/// let text = "
/// domain: d
/// descriptors:
///   - key: user
///     rate_limit: {name: general, unit: second, requests_per_unit: 5}
///   - key: vip
///     rate_limit:
///       replaces: [{name: general}]
///       unit: second
///       requests_per_unit: 50
/// ";
/// let config = Config::from_files([("d.yaml", text)])?;
/// let d = config.domain("d").unwrap();
/// let mut matches = vec![d.matching(&[("user", "alice")]), d.matching(&[("vip", "alice")])];
/// apply_replaces(&mut matches);
/// assert_eq!(matches[0].as_ref().unwrap().in_force().count(), 0);
/// assert_eq!(matches[1].as_ref().unwrap().in_force().count(), 1);
/// # Ok::<(), tollgate_server::config::ConfigFileError>(())
/// ```
pub fn apply_replaces(matches: &mut [Option<Match<'_>>]) {
    for at in 0..matches.len() {
        let Some(this) = &matches[at] else { continue };
        let mut replaced = 0;
        for (index, rule) in this.rules.iter().enumerate() {
            let Some(name) = rule.name.as_deref().filter(|_| !rule.unlimited) else {
                continue;
            };
            let named = matches
                .iter()
                .flatten()
                .flat_map(|other| other.rules)
                .any(|other| other.replaces.iter().any(|replaced| replaced == name));
            if named {
                replaced |= 1 << index;
            }
        }
        if let Some(this) = &mut matches[at] {
            this.replaced |= replaced;
        }
    }
}

/// One rate limit of the configuration: a `rate_limit` block, or one entry
/// of `rate_limits`, with the flags of its descriptor.
///
/// Two loads of the same text give equal rules; `==` compares everything, so
/// a rule whose [`id`](Rule::id) is unchanged but which is no longer equal
/// has a new definition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Rule {
    /// Where the rule is: stable across loads as long as its domain, the keys
    /// and values on its path and its place in `rate_limits` are.
    pub id: RuleId,
    /// `name`, for `replaces`.
    pub name: Option<String>,
    /// The names of the rules this one replaces.
    pub replaces: Vec<String>,
    /// `None` exactly when the rule is unlimited.
    pub unit: Option<Unit>,
    /// Requests per unit. Zero blocks every request (see
    /// [`blocks_all`](Rule::blocks_all)).
    pub requests_per_unit: u32,
    /// `unlimited: true`: the rule matches (for statistics, and to tell a
    /// known descriptor from an unknown one) but never limits.
    pub unlimited: bool,
    /// How requests are counted against the rate.
    pub algorithm: Algorithm,
    /// The descriptor's `shadow_mode`: count, and report over-limit requests
    /// in statistics, but answer OK.
    pub shadow_mode: bool,
    /// The descriptor's `quota_mode`: envoyproxy answers OVER_LIMIT for
    /// quota rules only when every quota rule of the request is over its
    /// limit.
    pub quota_mode: bool,
    /// The descriptor's `detailed_metric` (already applied to
    /// [`Match::stat_name`]).
    pub detailed_metric: bool,
}

impl Rule {
    /// The rate: `requests_per_unit` per [`Unit::duration`]; `None` for an
    /// unlimited rule. A rule that [blocks all](Rule::blocks_all) gives a
    /// zero rate, which tollgate's limiters refuse
    /// ([`ConfigError::ZeroRate`](tollgate::ConfigError::ZeroRate)): answer
    /// such a rule without a limiter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files([("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 30}\n")])?;
    /// let rule = config.domain("a").unwrap().rules().next().unwrap();
    /// assert_eq!(rule.rate(), Some(tollgate::Rate::per_minute(30)));
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn rate(&self) -> Option<Rate> {
        let unit = self.unit.filter(|_| !self.unlimited)?;
        Some(Rate::new(self.requests_per_unit, unit.duration()))
    }

    /// `requests_per_unit: 0` without `unlimited`: every request is over the
    /// limit (envoyproxy's README blocks an address this way).
    ///
    /// ```
    /// use tollgate_server::config::Config;
    /// let config = Config::from_files([("a.yaml", "domain: a\ndescriptors:\n  - key: ip\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n")])?;
    /// assert!(config.domain("a").unwrap().rules().next().unwrap().blocks_all());
    /// # Ok::<(), tollgate_server::config::ConfigFileError>(())
    /// ```
    pub fn blocks_all(&self) -> bool {
        !self.unlimited && self.requests_per_unit == 0
    }
}

/// A rule's place in the configuration: its domain, the (key, value) of each
/// descriptor from the top down to its own, and its index in `rate_limits`
/// (0 for `rate_limit`). Descriptors are unique by key and value within their
/// list, so the id names one rule.
///
/// Its `Display` form is `domain/key=value/key#index`, with `\`, `/`, `=`
/// and `#` inside the names escaped by a `\`, so that two ids never display
/// alike.
///
/// ```
/// use tollgate_server::config::Config;
/// let text = "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit: {unit: day, requests_per_unit: 5}\n";
/// let config = Config::from_files([("m.yaml", text)])?;
/// let id = &config.domain("messaging").unwrap().rules().next().unwrap().id;
/// assert_eq!(id.to_string(), "messaging/message_type=marketing/to_number#0");
/// assert_eq!(id.path[1], ("to_number".to_owned(), None));
/// # Ok::<(), tollgate_server::config::ConfigFileError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub struct RuleId {
    /// The domain.
    pub domain: String,
    /// Key and value (`None` for none) of each descriptor on the way.
    pub path: Vec<(String, Option<String>)>,
    /// The rule's index in its descriptor's `rate_limits`; 0 for `rate_limit`.
    pub index: usize,
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn escaped(f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
            for c in name.chars() {
                if matches!(c, '\\' | '/' | '=' | '#') {
                    f.write_str("\\")?;
                }
                write!(f, "{c}")?;
            }
            Ok(())
        }
        escaped(f, &self.domain)?;
        for (key, value) in &self.path {
            f.write_str("/")?;
            escaped(f, key)?;
            if let Some(value) = value {
                f.write_str("=")?;
                escaped(f, value)?;
            }
        }
        write!(f, "#{}", self.index)
    }
}

/// A rate limit's unit of time: envoyproxy/ratelimit's, with its durations
/// (a month is 30 days, a year 365).
///
/// ```
/// use std::time::Duration;
/// use tollgate_server::config::Unit;
///
/// assert_eq!(Unit::from_name("Minute"), Some(Unit::Minute));
/// assert_eq!(Unit::Month.duration(), Duration::from_secs(30 * 86_400));
/// assert_eq!(Unit::Hour.wire(), 3);
/// assert_eq!(Unit::from_wire(3), Some(Unit::Hour));
/// assert_eq!(Unit::Week.to_string(), "week");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length.
    ///
    /// ```
    /// assert_eq!(tollgate_server::config::Unit::Day.duration().as_secs(), 86_400);
    /// ```
    pub const fn duration(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        })
    }

    /// The unit's number on the wire: in Envoy's
    /// `RateLimitResponse.RateLimit.Unit` and `envoy.type.v3.RateLimitUnit`
    /// (`SECOND` = 1 ... `YEAR` = 6; `WEEK` = 7 in envoyproxy/ratelimit's
    /// protocol version).
    ///
    /// ```
    /// assert_eq!(tollgate_server::config::Unit::Week.wire(), 7);
    /// ```
    pub const fn wire(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit numbered `wire` on the wire; `None` for `UNKNOWN` (0) and
    /// numbers the protocol does not define.
    ///
    /// ```
    /// use tollgate_server::config::Unit;
    /// assert_eq!(Unit::from_wire(2), Some(Unit::Minute));
    /// assert_eq!(Unit::from_wire(0), None);
    /// ```
    pub const fn from_wire(wire: i32) -> Option<Unit> {
        Some(match wire {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// The unit's name in the protocol's enum, upper case (`"SECOND"`).
    ///
    /// ```
    /// assert_eq!(tollgate_server::config::Unit::Day.wire_name(), "DAY");
    /// ```
    pub const fn wire_name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// The unit's name in the files, lower case.
    ///
    /// ```
    /// assert_eq!(tollgate_server::config::Unit::Second.name(), "second");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit named `name`, in any case.
    ///
    /// ```
    /// use tollgate_server::config::Unit;
    /// assert_eq!(Unit::from_name("SECOND"), Some(Unit::Second));
    /// assert_eq!(Unit::from_name("fortnight"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a rule counts requests against its rate (tollgate's `algorithm`
/// field).
///
/// ```
/// use tollgate_server::config::Algorithm;
/// assert_eq!(Algorithm::default(), Algorithm::FixedWindow);
/// assert_eq!(Algorithm::TokenBucket { burst: 20 }.to_string(), "token_bucket (burst 20)");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// `requests_per_unit` in each window of one unit, the windows aligned to
    /// the Unix epoch: envoyproxy/ratelimit's counting, the default.
    #[default]
    FixedWindow,
    /// At most `requests_per_unit` in any window of one unit, exactly
    /// (tollgate's sliding log).
    SlidingLog,
    /// About `requests_per_unit` in any window of one unit, from a few
    /// counts. On the memory backend, at most `requests_per_unit` in any ten
    /// consecutive aligned sub-windows (tollgate's `SlidingWindow`). On the
    /// Redis backend, the two-window estimate (tollgate-redis's
    /// `ApproxSlidingWindow`): the current window's count plus the previous
    /// window's, weighted by the share of it the sliding window still
    /// covers. Neither is exact over every span of one unit; `sliding_log`
    /// is.
    SlidingWindow,
    /// `requests_per_unit` per unit on average, up to `burst` at once.
    TokenBucket {
        /// The bucket's capacity: `burst`, by default `requests_per_unit`.
        burst: u32,
    },
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algorithm::FixedWindow => f.write_str("fixed_window"),
            Algorithm::SlidingLog => f.write_str("sliding_log"),
            Algorithm::SlidingWindow => f.write_str("sliding_window"),
            Algorithm::TokenBucket { burst } => write!(f, "token_bucket (burst {burst})"),
        }
    }
}

/// A value of a descriptor's `metadata`, as a protobuf `google.protobuf.Value`
/// holds it (numbers are doubles), for Envoy's dynamic metadata.
///
/// ```
/// use tollgate_server::config::MetadataValue;
/// let v = MetadataValue::List(vec![MetadataValue::Number(1.0), MetadataValue::Null]);
/// assert!(matches!(v, MetadataValue::List(items) if items.len() == 2));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// `null` or nothing.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// Any number.
    Number(f64),
    /// A string.
    String(String),
    /// A sequence.
    List(Vec<MetadataValue>),
    /// A mapping, its keys as text.
    Struct(BTreeMap<String, MetadataValue>),
}

/// A configuration file refused, or one that could not be read: which file,
/// where in it, and why.
///
/// `Display` writes `file:line:column: reason` (`file: reason` when there is
/// no position, as for an unreadable file or an empty one). The reason may
/// start with the path to the node in the file (`descriptors[0].rate_limit:
/// ...`).
///
/// ```
/// use tollgate_server::config::Config;
///
/// let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n";
/// let err = Config::from_files([("d.yaml", text)]).unwrap_err();
/// assert_eq!((err.line, err.column), (Some(5), Some(13)));
/// assert!(err.reason.contains("invalid rate limit unit 'fortnight'"));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct ConfigFileError {
    /// The file, as named to [`Config::from_files`] or found by
    /// [`Config::load_dir`].
    pub file: PathBuf,
    /// The line, from 1.
    pub line: Option<usize>,
    /// The column, from 1.
    pub column: Option<usize>,
    /// What is wrong.
    pub reason: String,
    /// The I/O error, or the core's [`tollgate::ConfigError`] for a rate its
    /// limiters refuse.
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl ConfigFileError {
    fn io(file: PathBuf, error: io::Error) -> ConfigFileError {
        ConfigFileError {
            file,
            line: None,
            column: None,
            reason: error.to_string(),
            source: Some(Box::new(error)),
        }
    }

    fn yaml(
        file: &Path,
        error: &serde_yaml_ng::Error,
        limit: Option<tollgate::ConfigError>,
    ) -> ConfigFileError {
        let location = error.location();
        let mut reason = error.to_string();
        // The YAML error's text ends with its position, which `Display`
        // already writes up front.
        if let Some(location) = &location {
            let position = format!(" at line {} column {}", location.line(), location.column());
            if let Some(at) = reason.find(&position) {
                reason.replace_range(at..at + position.len(), "");
            }
        }
        ConfigFileError {
            file: file.to_owned(),
            line: location.as_ref().map(serde_yaml_ng::Location::line),
            column: location.as_ref().map(serde_yaml_ng::Location::column),
            reason,
            source: limit.map(|error| Box::new(error) as Box<dyn Error + Send + Sync>),
        }
    }
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        write!(f, ": {}", self.reason)
    }
}

impl Error for ConfigFileError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn Error + 'static))
    }
}

/// What a request gets when Redis cannot answer within the client's
/// timeout (down, paused, unreachable, or a key holding something that is
/// not a limit's state): the server's default
/// ([`RedisSettings::failure`](crate::RedisSettings::failure)), or a
/// domain's own (`failure_mode: open`, `closed` or `local` at the top of
/// its file, beside `domain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Failure {
    /// Admitted, by no limit: the service stays up, the limits lapse.
    Open,
    /// Refused: `OVER_LIMIT` for every descriptor with an enforced limit
    /// (shadow-mode and quota-mode limits are not asked). A request without
    /// an enforced limit is admitted.
    Closed,
    /// Decided by this replica alone, on the memory backend's limits: each
    /// replica admits up to the whole limit, so N replicas admit up to N
    /// times it while Redis is away. The default.
    #[default]
    Local,
}

impl std::str::FromStr for Failure {
    type Err = String;

    fn from_str(s: &str) -> Result<Failure, String> {
        match s {
            "open" | "fail_open" => Ok(Failure::Open),
            "closed" | "fail_closed" => Ok(Failure::Closed),
            "local" => Ok(Failure::Local),
            other => Err(format!(
                "unknown failure mode {other:?}: open, closed or local"
            )),
        }
    }
}

/// A configuration the server cannot decide with: a rule whose rate the
/// limiters refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRule {
    /// The rule's identity.
    pub rule: String,
    /// The limiters' reason.
    pub error: tollgate::ConfigError,
}

impl std::fmt::Display for InvalidRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rule {}: {}", self.rule, self.error)
    }
}

impl std::error::Error for InvalidRule {}
