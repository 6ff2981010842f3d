//! Pure validation of `NodeIPAMConfig` specs (the CRD's CEL rules plus NodeSelector
//! well-formedness as core/v1 defines it), with Kubernetes-style field errors, and the overlap
//! report between configs.
//!
//! The webhook and the controller use this so that they agree with the API server: every check
//! the CRD schema makes is made here too. What a range *is* (parsing, limits, overlap, block
//! counts) lives in [`crate::range`]; this module only turns its findings into field errors.

use std::fmt;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
use thiserror::Error;

use crate::limits::{
    MAX_BLOCK_BITS, MAX_CIDR_LENGTH, MAX_DNS_SUBDOMAIN_LENGTH, MAX_LABEL_VALUE_LENGTH,
    MAX_NODE_SELECTOR_TERMS, MAX_REQUIREMENTS_PER_TERM, MAX_SELECTOR_VALUES,
};
// Re-exported: these were defined here before `range` existed, and callers name them here.
pub use crate::range::{
    CidrError, Family, FamilyRange, RangeError, Ranges, SplitError, overlaps, parse_cidr,
};
use crate::types::{FamilySpec, NodeIPAMConfigSpec};

mod pool;
mod space;
pub use pool::{ParsedPool, PoolFamily, validate_pool_name, validate_pool_update};
pub use space::{PoolCidr, ServiceRangeRef, config_pool_conflicts, pool_conflicts};

/// What is wrong with a field, named as Kubernetes names it in `field.ErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// A required field is missing or empty.
    Required,
    /// The value is malformed or out of range.
    Invalid,
    /// The field may not be set, or may not change.
    Forbidden,
    /// The value is not one of the supported values.
    NotSupported,
    /// The value is longer than allowed.
    TooLong,
    /// The list has more items than allowed.
    TooMany,
}

impl FieldErrorKind {
    /// The phrase Kubernetes prints for this kind (`field.ErrorType.String()`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::Forbidden => "Forbidden",
            Self::NotSupported => "Unsupported value",
            Self::TooLong => "Too long",
            Self::TooMany => "Too many",
        }
    }

    /// The `metav1.CauseType` Kubernetes gives a `StatusCause` of this kind
    /// (`field.ErrorType` as a string, e.g. `FieldValueInvalid`).
    pub fn cause_type(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::Forbidden => "FieldValueForbidden",
            Self::NotSupported => "FieldValueNotSupported",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
        }
    }

    /// Whether Kubernetes prints the offending value for this kind.
    fn shows_value(self) -> bool {
        matches!(self, Self::Invalid | Self::NotSupported)
    }
}

impl fmt::Display for FieldErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem with one field, displayed like a Kubernetes `field.Error`, e.g.
/// `spec.ipv4.cidr: Invalid value: "10.0.0.1/16": must be canonical (host bits zero): did you mean 10.0.0.0/16?`
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{path}: {}", body(*.kind, .value.as_deref(), .detail))]
pub struct FieldError {
    /// Field path from the object root, e.g. `spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[1].values`.
    pub path: String,
    /// What kind of problem.
    pub kind: FieldErrorKind,
    /// The offending value, when there is one to show.
    pub value: Option<String>,
    /// Why the value is wrong and, where useful, what to do instead.
    pub detail: String,
}

fn body(kind: FieldErrorKind, value: Option<&str>, detail: &str) -> String {
    let mut out = kind.as_str().to_owned();
    if kind.shows_value()
        && let Some(value) = value
    {
        out.push_str(&format!(": {value:?}"));
    }
    if !detail.is_empty() {
        out.push_str(": ");
        out.push_str(detail);
    }
    out
}

impl FieldError {
    /// The message without the field path (`field.Error.ErrorBody()`): what a `StatusCause`
    /// carries next to its `field`, e.g. `Invalid value: "10.0.0.1/16": must be canonical ...`.
    pub fn body(&self) -> String {
        body(self.kind, self.value.as_deref(), &self.detail)
    }

    fn new(
        path: impl Into<String>,
        kind: FieldErrorKind,
        value: Option<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            path: path.into(),
            kind,
            value,
            detail: detail.into(),
        }
    }

    fn required(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(path, FieldErrorKind::Required, None, detail)
    }

    fn invalid(path: impl Into<String>, value: impl ToString, detail: impl Into<String>) -> Self {
        Self::new(
            path,
            FieldErrorKind::Invalid,
            Some(value.to_string()),
            detail,
        )
    }

    fn forbidden(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(path, FieldErrorKind::Forbidden, None, detail)
    }

    fn not_supported(path: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list = supported
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        Self::new(
            path,
            FieldErrorKind::NotSupported,
            Some(value.to_owned()),
            format!("supported values: {list}"),
        )
    }

    fn too_long(path: impl Into<String>, max: usize) -> Self {
        Self::new(
            path,
            FieldErrorKind::TooLong,
            None,
            format!("may not be more than {max} bytes"),
        )
    }

    fn too_many(path: impl Into<String>, actual: usize, max: usize) -> Self {
        Self::new(
            path,
            FieldErrorKind::TooMany,
            None,
            format!("{actual}: must have at most {max} items"),
        )
    }
}

/// Joins errors the way Kubernetes aggregates them: one error alone, several as `[a, b]`.
pub fn format_errors(errors: &[FieldError]) -> String {
    match errors {
        [one] => one.to_string(),
        many => format!(
            "[{}]",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl NodeIPAMConfigSpec {
    /// The parsed ranges, or every error in `spec.ipv4` / `spec.ipv6` (including a spec with
    /// neither). Node selector errors are not included: see [`validate_spec`].
    pub fn ranges(&self) -> Result<Ranges, Vec<FieldError>> {
        let mut errors = Vec::new();
        if self.ipv4.is_none() && self.ipv6.is_none() {
            errors.push(FieldError::required(
                "spec",
                format!(
                    "at least one of spec.ipv4 or spec.ipv6 is required, e.g. ipv4: {{cidr: {}, perNodeMaskSize: 24}}",
                    Family::V4.example()
                ),
            ));
        }
        let ipv4 = parse_family(self.ipv4.as_ref(), Family::V4, &mut errors);
        let ipv6 = parse_family(self.ipv6.as_ref(), Family::V6, &mut errors);
        if errors.is_empty() {
            Ok(Ranges { ipv4, ipv6 })
        } else {
            Err(errors)
        }
    }
}

impl FamilySpec {
    /// This family's range, checked as the CRD's CEL rules check it; see [`FamilyRange::parse`].
    pub fn range(&self, family: Family) -> Result<FamilyRange, Vec<RangeError>> {
        FamilyRange::parse(&self.cidr, self.per_node_mask_size, family)
    }

    /// The range this spec names even if it is invalid; see [`FamilyRange::claimed`].
    pub fn claimed(&self) -> Option<FamilyRange> {
        FamilyRange::claimed(&self.cidr, self.per_node_mask_size)
    }
}

impl Ranges {
    /// The ranges a spec names even if it is invalid (see [`FamilyRange::claimed`]); a family
    /// whose CIDR does not parse at all is absent.
    pub fn claimed(spec: &NodeIPAMConfigSpec) -> Self {
        Self {
            ipv4: spec.ipv4.as_ref().and_then(FamilySpec::claimed),
            ipv6: spec.ipv6.as_ref().and_then(FamilySpec::claimed),
        }
    }
}

/// One family's range, appending its errors (in field order: CIDR, then mask) to `errors`.
fn parse_family(
    spec: Option<&FamilySpec>,
    family: Family,
    errors: &mut Vec<FieldError>,
) -> Option<FamilyRange> {
    let spec = spec?;
    spec.range(family)
        .map_err(|found| {
            errors.extend(
                found
                    .into_iter()
                    .filter_map(|e| field_error(&e, spec, family)),
            );
        })
        .ok()
}

/// The field error for one problem of `spec`, in the words the CEL rules' Rust twin has always
/// used (the webhook's denials quote them).
fn field_error(e: &RangeError, spec: &FamilySpec, family: Family) -> Option<FieldError> {
    let base = format!("spec.{}", family.field());
    let cidr_path = format!("{base}.cidr");
    let mask_path = format!("{base}.perNodeMaskSize");
    let cidr = &spec.cidr;
    let mask = spec.per_node_mask_size;
    let example = family.example();
    Some(match e {
        RangeError::MissingCidr => {
            FieldError::required(cidr_path, format!("must be a CIDR such as {example}"))
        }
        RangeError::CidrTooLong => FieldError::too_long(cidr_path, MAX_CIDR_LENGTH),
        RangeError::Malformed(reason) => FieldError::invalid(
            cidr_path,
            cidr,
            format!("must be a CIDR such as {example}: {reason}"),
        ),
        RangeError::WrongFamily { actual, .. } => FieldError::invalid(
            cidr_path,
            cidr,
            format!(
                "must be an {family} CIDR such as {example}; put {actual} ranges in spec.{}",
                actual.field()
            ),
        ),
        RangeError::NotCanonical { canonical } => FieldError::invalid(
            cidr_path,
            cidr,
            format!("must be canonical (host bits zero): did you mean {canonical}?"),
        ),
        RangeError::MaskTooLong { max, .. } => FieldError::invalid(
            mask_path,
            mask,
            format!(
                "must be at most {max} for {family}: a block must hold more than one pod address"
            ),
        ),
        RangeError::Split(SplitError::MaskShorterThanPrefix { prefix, .. }) => FieldError::invalid(
            mask_path,
            mask,
            format!("must be at least the prefix length of {cidr_path} ({prefix})"),
        ),
        RangeError::Split(SplitError::TooManyBlocks { prefix, .. }) => FieldError::invalid(
            mask_path,
            mask,
            format!(
                "must be at most {} (the prefix length of {cidr_path} plus {MAX_BLOCK_BITS}): a range holds at most 2^{MAX_BLOCK_BITS} blocks",
                u16::from(*prefix) + u16::from(MAX_BLOCK_BITS)
            ),
        ),
        // `parse` checks the family's own, stricter, mask limit instead.
        RangeError::Split(SplitError::MaskBeyondFamily { .. }) => return None,
    })
}

/// Every error in a spec: ranges (as the CEL rules check them) and node selector.
pub fn validate_spec(spec: &NodeIPAMConfigSpec) -> Vec<FieldError> {
    let mut errors = spec.ranges().err().unwrap_or_default();
    if let Some(selector) = &spec.node_selector {
        errors.extend(validate_node_selector(selector, "spec.nodeSelector"));
    }
    errors
}

const IMMUTABLE_HINT: &str = "create a new NodeIPAMConfig and delete this one to drain it";

/// Errors in the transition from `old` to `new`: everything but `allocation` is immutable.
///
/// Only transition errors are returned. Like the API server's validation ratcheting, fields
/// that did not change are not re-validated, so an old config that fails today's rules can
/// still be disabled or deleted; call [`validate_spec`] for a new object.
pub fn validate_update(old: &NodeIPAMConfigSpec, new: &NodeIPAMConfigSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for family in Family::ALL {
        let (old_family, new_family) = match family {
            Family::V4 => (&old.ipv4, &new.ipv4),
            Family::V6 => (&old.ipv6, &new.ipv6),
        };
        let base = format!("spec.{}", family.field());
        match (old_family, new_family) {
            (None, Some(_)) => errors.push(FieldError::forbidden(
                &base,
                format!(
                    "{family} cannot be added to an existing NodeIPAMConfig: create a new NodeIPAMConfig for the {family} range"
                ),
            )),
            (Some(_), None) => errors.push(FieldError::forbidden(
                &base,
                format!(
                    "{family} cannot be removed from an existing NodeIPAMConfig: {IMMUTABLE_HINT} (or set allocation: Disabled)"
                ),
            )),
            (Some(o), Some(n)) => {
                if o.cidr != n.cidr {
                    errors.push(FieldError::invalid(
                        format!("{base}.cidr"),
                        &n.cidr,
                        format!("is immutable (was {}): {IMMUTABLE_HINT}", o.cidr),
                    ));
                }
                if o.per_node_mask_size != n.per_node_mask_size {
                    errors.push(FieldError::invalid(
                        format!("{base}.perNodeMaskSize"),
                        n.per_node_mask_size,
                        format!(
                            "is immutable (was {}): {IMMUTABLE_HINT}",
                            o.per_node_mask_size
                        ),
                    ));
                }
            }
            (None, None) => {}
        }
    }
    if old.node_selector != new.node_selector {
        errors.push(FieldError::forbidden(
            "spec.nodeSelector",
            format!("is immutable: {IMMUTABLE_HINT}"),
        ));
    }
    errors
}

const EXPRESSION_OPERATORS: [&str; 6] = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"];
const FIELD_OPERATORS: [&str; 2] = ["In", "NotIn"];
const FIELD_KEYS: [&str; 1] = ["metadata.name"];

/// Checks a node selector as core/v1 does for required node affinity, plus this CRD's list
/// size limits. `path` is the selector's own path, e.g. `spec.nodeSelector`.
pub fn validate_node_selector(sel: &NodeSelector, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let terms_path = format!("{path}.nodeSelectorTerms");
    let terms = &sel.node_selector_terms;
    if terms.is_empty() {
        errors.push(FieldError::required(
            &terms_path,
            "must have at least one node selector term",
        ));
        return errors;
    }
    if terms.len() > MAX_NODE_SELECTOR_TERMS {
        errors.push(FieldError::too_many(
            &terms_path,
            terms.len(),
            MAX_NODE_SELECTOR_TERMS,
        ));
    }
    for (i, term) in terms.iter().enumerate() {
        let term_path = format!("{terms_path}[{i}]");
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        for (list, name) in [(expressions, "matchExpressions"), (fields, "matchFields")] {
            if list.len() > MAX_REQUIREMENTS_PER_TERM {
                errors.push(FieldError::too_many(
                    format!("{term_path}.{name}"),
                    list.len(),
                    MAX_REQUIREMENTS_PER_TERM,
                ));
            }
        }
        for (j, req) in expressions.iter().enumerate() {
            validate_label_requirement(
                req,
                &format!("{term_path}.matchExpressions[{j}]"),
                &mut errors,
            );
        }
        for (j, req) in fields.iter().enumerate() {
            validate_field_requirement(req, &format!("{term_path}.matchFields[{j}]"), &mut errors);
        }
    }
    errors
}

fn check_values_count(values: &[String], values_path: &str, errors: &mut Vec<FieldError>) {
    if values.len() > MAX_SELECTOR_VALUES {
        errors.push(FieldError::too_many(
            values_path,
            values.len(),
            MAX_SELECTOR_VALUES,
        ));
    }
}

fn validate_label_requirement(
    req: &NodeSelectorRequirement,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let values = req.values.as_deref().unwrap_or_default();
    let values_path = format!("{path}.values");
    check_values_count(values, &values_path, errors);
    match req.operator.as_str() {
        "In" | "NotIn" => {
            if values.is_empty() {
                errors.push(FieldError::required(
                    &values_path,
                    "must be specified when `operator` is 'In' or 'NotIn'",
                ));
            }
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                errors.push(FieldError::forbidden(
                    &values_path,
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                ));
            }
        }
        "Gt" | "Lt" => {
            if values.len() != 1 {
                errors.push(FieldError::required(
                    &values_path,
                    "must be a single integer value when `operator` is 'Gt' or 'Lt'",
                ));
            } else if let Some(value) = values.first()
                && value.parse::<i64>().is_err()
            {
                errors.push(FieldError::invalid(
                    format!("{values_path}[0]"),
                    value,
                    "must be an integer when `operator` is 'Gt' or 'Lt'",
                ));
            }
        }
        other => errors.push(FieldError::not_supported(
            format!("{path}.operator"),
            other,
            &EXPRESSION_OPERATORS,
        )),
    }
    for reason in label_key_errors(&req.key) {
        errors.push(FieldError::invalid(format!("{path}.key"), &req.key, reason));
    }
    // Core checks every value as a label value, Gt/Lt included (so negative numbers fail).
    for (k, value) in values.iter().enumerate() {
        for reason in label_value_errors(value) {
            errors.push(FieldError::invalid(
                format!("{values_path}[{k}]"),
                value,
                reason,
            ));
        }
    }
}

fn validate_field_requirement(
    req: &NodeSelectorRequirement,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let values = req.values.as_deref().unwrap_or_default();
    let values_path = format!("{path}.values");
    check_values_count(values, &values_path, errors);
    if FIELD_OPERATORS.contains(&req.operator.as_str()) {
        if values.len() != 1 {
            errors.push(FieldError::required(
                &values_path,
                "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
            ));
        }
    } else {
        errors.push(FieldError::not_supported(
            format!("{path}.operator"),
            &req.operator,
            &FIELD_OPERATORS,
        ));
    }
    if !FIELD_KEYS.contains(&req.key.as_str()) {
        errors.push(FieldError::not_supported(
            format!("{path}.key"),
            &req.key,
            &FIELD_KEYS,
        ));
        return;
    }
    for (k, value) in values.iter().enumerate() {
        for reason in dns_subdomain_errors(value) {
            errors.push(FieldError::invalid(
                format!("{values_path}[{k}]"),
                value,
                reason,
            ));
        }
    }
}

const LABEL_NAME_MAX: usize = MAX_LABEL_VALUE_LENGTH;
const DNS_SUBDOMAIN_MAX: usize = MAX_DNS_SUBDOMAIN_LENGTH;
const LABEL_NAME_CHARS: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const DNS_SUBDOMAIN_CHARS: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, the shape of label names and non-empty values.
fn is_label_token(s: &str) -> bool {
    let bytes = s.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A lowercase RFC 1123 subdomain: dot-separated labels `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
pub fn dns_subdomain_errors(s: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if s.len() > DNS_SUBDOMAIN_MAX {
        errors.push(format!(
            "must be no more than {DNS_SUBDOMAIN_MAX} characters"
        ));
    }
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => {
                let end_ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
                end_ok(first) && end_ok(last) && bytes.iter().all(|b| end_ok(b) || *b == b'-')
            }
            _ => false,
        }
    };
    if !s.split('.').all(label_ok) {
        errors.push(format!("{DNS_SUBDOMAIN_CHARS} (e.g. 'example.com')"));
    }
    errors
}

/// Errors for a label key (a "qualified name": optional DNS subdomain prefix, '/', name).
pub fn label_key_errors(key: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let name = match key.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    dns_subdomain_errors(prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            *name
        }
        _ => {
            errors.push(format!(
                "a valid label key {LABEL_NAME_CHARS}, with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            ));
            return errors;
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > LABEL_NAME_MAX {
        errors.push(format!(
            "name part must be no more than {LABEL_NAME_MAX} characters"
        ));
    }
    if !is_label_token(name) {
        errors.push(format!(
            "name part {LABEL_NAME_CHARS} (e.g. 'MyName', 'my.name' or '123-abc')"
        ));
    }
    errors
}

/// Errors for a label value: empty, or at most 63 characters shaped like a label name.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_NAME_MAX {
        errors.push(format!("must be no more than {LABEL_NAME_MAX} characters"));
    }
    if !value.is_empty() && !is_label_token(value) {
        errors.push(format!(
            "a valid label must be an empty string or {LABEL_NAME_CHARS} (e.g. 'MyValue', 'my_value' or '12345')"
        ));
    }
    errors
}

/// A range of ours that shares addresses with a range of another `NodeIPAMConfig`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Overlap {
    pub family: Family,
    /// Name of the other NodeIPAMConfig.
    pub other: String,
    pub ours: IpNet,
    pub theirs: IpNet,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} range {} overlaps {} of NodeIPAMConfig {:?}",
            self.family, self.ours, self.theirs, self.other
        )
    }
}

/// Every overlap between our ranges and the ranges of `others` (name, ranges), per family, in
/// the order given. The caller leaves its own config out of `others`.
pub fn find_overlaps<'a>(
    ours: &Ranges,
    others: impl IntoIterator<Item = (&'a str, &'a Ranges)>,
) -> Vec<Overlap> {
    let mut found = Vec::new();
    for (name, theirs) in others {
        for (family, our_range) in ours.iter() {
            if let Some(their_range) = theirs.get(family)
                && overlaps(&our_range.cidr, &their_range.cidr)
            {
                found.push(Overlap {
                    family,
                    other: name.to_owned(),
                    ours: our_range.cidr,
                    theirs: their_range.cidr,
                });
            }
        }
    }
    found
}
