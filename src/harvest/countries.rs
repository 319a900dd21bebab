//! English country names as lists write them (`The Netherlands`, `Türkiye`,
//! `Congo (DRC)`, `South Korea`) to ISO 3166-1 codes: every ISO short name,
//! the common short forms, and the spellings seen in public lists. Letters
//! with accents match their plain form and a replacement character from
//! lossy decoding (`T\u{FFFD}rkiye`), because lists are often Latin-1.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::proxy::Country;

/// (code, names): the ISO short name first, then other spellings.
const NAMES: &[(&str, &[&str])] = &[
    ("AD", &["Andorra"]),
    ("AE", &["United Arab Emirates", "UAE", "Emirates"]),
    ("AF", &["Afghanistan"]),
    ("AG", &["Antigua and Barbuda", "Antigua & Barbuda"]),
    ("AI", &["Anguilla"]),
    ("AL", &["Albania"]),
    ("AM", &["Armenia"]),
    ("AO", &["Angola"]),
    ("AQ", &["Antarctica"]),
    ("AR", &["Argentina"]),
    ("AS", &["American Samoa"]),
    ("AT", &["Austria"]),
    ("AU", &["Australia"]),
    ("AW", &["Aruba"]),
    ("AX", &["Åland Islands", "Aland Islands", "Åland", "Aland"]),
    ("AZ", &["Azerbaijan"]),
    (
        "BA",
        &["Bosnia and Herzegovina", "Bosnia & Herzegovina", "Bosnia"],
    ),
    ("BB", &["Barbados"]),
    ("BD", &["Bangladesh"]),
    ("BE", &["Belgium"]),
    ("BF", &["Burkina Faso"]),
    ("BG", &["Bulgaria"]),
    ("BH", &["Bahrain"]),
    ("BI", &["Burundi"]),
    ("BJ", &["Benin"]),
    (
        "BL",
        &["Saint Barthélemy", "St. Barthélemy", "St Barthélemy"],
    ),
    ("BM", &["Bermuda"]),
    ("BN", &["Brunei", "Brunei Darussalam"]),
    ("BO", &["Bolivia", "Plurinational State of Bolivia"]),
    (
        "BQ",
        &[
            "Bonaire, Sint Eustatius and Saba",
            "Caribbean Netherlands",
            "Bonaire",
        ],
    ),
    ("BR", &["Brazil", "Brasil"]),
    ("BS", &["Bahamas", "The Bahamas"]),
    ("BT", &["Bhutan"]),
    ("BV", &["Bouvet Island"]),
    ("BW", &["Botswana"]),
    ("BY", &["Belarus"]),
    ("BZ", &["Belize"]),
    ("CA", &["Canada"]),
    ("CC", &["Cocos (Keeling) Islands", "Cocos Islands"]),
    (
        "CD",
        &[
            "Congo (DRC)",
            "DR Congo",
            "Democratic Republic of the Congo",
            "Congo, The Democratic Republic of the",
            "Congo - Kinshasa",
            "Congo-Kinshasa",
            "DRC",
        ],
    ),
    ("CF", &["Central African Republic"]),
    (
        "CG",
        &[
            "Congo",
            "Republic of the Congo",
            "Congo (Republic)",
            "Congo - Brazzaville",
            "Congo-Brazzaville",
        ],
    ),
    ("CH", &["Switzerland"]),
    ("CI", &["Côte d'Ivoire", "Cote d'Ivoire", "Ivory Coast"]),
    ("CK", &["Cook Islands"]),
    ("CL", &["Chile"]),
    ("CM", &["Cameroon"]),
    ("CN", &["China", "People's Republic of China", "PRC"]),
    ("CO", &["Colombia"]),
    ("CR", &["Costa Rica"]),
    ("CU", &["Cuba"]),
    ("CV", &["Cabo Verde", "Cape Verde"]),
    ("CW", &["Curaçao", "Curacao"]),
    ("CX", &["Christmas Island"]),
    ("CY", &["Cyprus"]),
    ("CZ", &["Czechia", "Czech Republic"]),
    ("DE", &["Germany", "Deutschland"]),
    ("DJ", &["Djibouti"]),
    ("DK", &["Denmark"]),
    ("DM", &["Dominica"]),
    ("DO", &["Dominican Republic"]),
    ("DZ", &["Algeria"]),
    ("EC", &["Ecuador"]),
    ("EE", &["Estonia"]),
    ("EG", &["Egypt"]),
    ("EH", &["Western Sahara"]),
    ("ER", &["Eritrea"]),
    ("ES", &["Spain", "España"]),
    ("ET", &["Ethiopia"]),
    ("FI", &["Finland"]),
    ("FJ", &["Fiji"]),
    ("FK", &["Falkland Islands", "Falkland Islands (Malvinas)"]),
    ("FM", &["Micronesia", "Federated States of Micronesia"]),
    ("FO", &["Faroe Islands", "Faeroe Islands"]),
    ("FR", &["France"]),
    ("GA", &["Gabon"]),
    (
        "GB",
        &[
            "United Kingdom",
            "UK",
            "Great Britain",
            "Britain",
            "England",
            "Scotland",
            "Wales",
            "Northern Ireland",
            "United Kingdom of Great Britain and Northern Ireland",
        ],
    ),
    ("GD", &["Grenada"]),
    ("GE", &["Georgia"]),
    ("GF", &["French Guiana"]),
    ("GG", &["Guernsey"]),
    ("GH", &["Ghana"]),
    ("GI", &["Gibraltar"]),
    ("GL", &["Greenland"]),
    ("GM", &["Gambia", "The Gambia"]),
    ("GN", &["Guinea"]),
    ("GP", &["Guadeloupe"]),
    ("GQ", &["Equatorial Guinea"]),
    ("GR", &["Greece"]),
    ("GS", &["South Georgia and the South Sandwich Islands"]),
    ("GT", &["Guatemala"]),
    ("GU", &["Guam"]),
    ("GW", &["Guinea-Bissau", "Guinea Bissau"]),
    ("GY", &["Guyana"]),
    (
        "HK",
        &[
            "Hong Kong",
            "Hong Kong SAR",
            "Hong Kong SAR China",
            "Hongkong",
        ],
    ),
    ("HM", &["Heard Island and McDonald Islands"]),
    ("HN", &["Honduras"]),
    ("HR", &["Croatia"]),
    ("HT", &["Haiti"]),
    ("HU", &["Hungary"]),
    ("ID", &["Indonesia"]),
    ("IE", &["Ireland", "Republic of Ireland"]),
    ("IL", &["Israel"]),
    ("IM", &["Isle of Man"]),
    ("IN", &["India"]),
    ("IO", &["British Indian Ocean Territory"]),
    ("IQ", &["Iraq"]),
    (
        "IR",
        &[
            "Iran",
            "Islamic Republic of Iran",
            "Iran, Islamic Republic of",
        ],
    ),
    ("IS", &["Iceland"]),
    ("IT", &["Italy"]),
    ("JE", &["Jersey"]),
    ("JM", &["Jamaica"]),
    ("JO", &["Jordan"]),
    ("JP", &["Japan"]),
    ("KE", &["Kenya"]),
    ("KG", &["Kyrgyzstan", "Kyrgyz Republic"]),
    ("KH", &["Cambodia"]),
    ("KI", &["Kiribati"]),
    ("KM", &["Comoros"]),
    (
        "KN",
        &[
            "Saint Kitts and Nevis",
            "St. Kitts and Nevis",
            "St Kitts and Nevis",
            "St. Kitts & Nevis",
        ],
    ),
    (
        "KP",
        &[
            "North Korea",
            "Democratic People's Republic of Korea",
            "Korea, Democratic People's Republic of",
        ],
    ),
    (
        "KR",
        &[
            "South Korea",
            "Korea",
            "Republic of Korea",
            "Korea, Republic of",
        ],
    ),
    ("KW", &["Kuwait"]),
    ("KY", &["Cayman Islands"]),
    ("KZ", &["Kazakhstan"]),
    (
        "LA",
        &["Laos", "Lao People's Democratic Republic", "Lao PDR"],
    ),
    ("LB", &["Lebanon"]),
    ("LC", &["Saint Lucia", "St. Lucia", "St Lucia"]),
    ("LI", &["Liechtenstein"]),
    ("LK", &["Sri Lanka"]),
    ("LR", &["Liberia"]),
    ("LS", &["Lesotho"]),
    ("LT", &["Lithuania"]),
    ("LU", &["Luxembourg"]),
    ("LV", &["Latvia"]),
    ("LY", &["Libya"]),
    ("MA", &["Morocco"]),
    ("MC", &["Monaco"]),
    (
        "MD",
        &["Moldova", "Republic of Moldova", "Moldova, Republic of"],
    ),
    ("ME", &["Montenegro"]),
    (
        "MF",
        &["Saint Martin", "St. Martin", "Saint Martin (French part)"],
    ),
    ("MG", &["Madagascar"]),
    ("MH", &["Marshall Islands"]),
    (
        "MK",
        &[
            "North Macedonia",
            "Macedonia",
            "Republic of North Macedonia",
        ],
    ),
    ("ML", &["Mali"]),
    ("MM", &["Myanmar", "Burma", "Myanmar (Burma)"]),
    ("MN", &["Mongolia"]),
    ("MO", &["Macao", "Macau", "Macao SAR China", "Macau SAR"]),
    ("MP", &["Northern Mariana Islands"]),
    ("MQ", &["Martinique"]),
    ("MR", &["Mauritania"]),
    ("MS", &["Montserrat"]),
    ("MT", &["Malta"]),
    ("MU", &["Mauritius"]),
    ("MV", &["Maldives"]),
    ("MW", &["Malawi"]),
    ("MX", &["Mexico", "México"]),
    ("MY", &["Malaysia"]),
    ("MZ", &["Mozambique"]),
    ("NA", &["Namibia"]),
    ("NC", &["New Caledonia"]),
    ("NE", &["Niger"]),
    ("NF", &["Norfolk Island"]),
    ("NG", &["Nigeria"]),
    ("NI", &["Nicaragua"]),
    (
        "NL",
        &[
            "Netherlands",
            "The Netherlands",
            "Holland",
            "Netherlands (Kingdom of the)",
        ],
    ),
    ("NO", &["Norway"]),
    ("NP", &["Nepal"]),
    ("NR", &["Nauru"]),
    ("NU", &["Niue"]),
    ("NZ", &["New Zealand"]),
    ("OM", &["Oman"]),
    ("PA", &["Panama"]),
    ("PE", &["Peru"]),
    ("PF", &["French Polynesia"]),
    ("PG", &["Papua New Guinea"]),
    ("PH", &["Philippines", "The Philippines"]),
    ("PK", &["Pakistan"]),
    ("PL", &["Poland"]),
    (
        "PM",
        &["Saint Pierre and Miquelon", "St. Pierre and Miquelon"],
    ),
    ("PN", &["Pitcairn", "Pitcairn Islands"]),
    ("PR", &["Puerto Rico"]),
    (
        "PS",
        &[
            "Palestine",
            "State of Palestine",
            "Palestinian Territories",
            "Palestinian Territory",
            "Palestine, State of",
        ],
    ),
    ("PT", &["Portugal"]),
    ("PW", &["Palau"]),
    ("PY", &["Paraguay"]),
    ("QA", &["Qatar"]),
    ("RE", &["Réunion", "Reunion"]),
    ("RO", &["Romania"]),
    ("RS", &["Serbia"]),
    ("RU", &["Russia", "Russian Federation"]),
    ("RW", &["Rwanda"]),
    ("SA", &["Saudi Arabia"]),
    ("SB", &["Solomon Islands"]),
    ("SC", &["Seychelles"]),
    ("SD", &["Sudan"]),
    ("SE", &["Sweden"]),
    ("SG", &["Singapore"]),
    (
        "SH",
        &[
            "Saint Helena",
            "St. Helena",
            "Saint Helena, Ascension and Tristan da Cunha",
        ],
    ),
    ("SI", &["Slovenia"]),
    ("SJ", &["Svalbard and Jan Mayen", "Svalbard & Jan Mayen"]),
    ("SK", &["Slovakia", "Slovak Republic"]),
    ("SL", &["Sierra Leone"]),
    ("SM", &["San Marino"]),
    ("SN", &["Senegal"]),
    ("SO", &["Somalia"]),
    ("SR", &["Suriname"]),
    ("SS", &["South Sudan"]),
    (
        "ST",
        &[
            "Sao Tome and Principe",
            "São Tomé and Príncipe",
            "São Tomé & Príncipe",
        ],
    ),
    ("SV", &["El Salvador"]),
    ("SX", &["Sint Maarten", "Sint Maarten (Dutch part)"]),
    ("SY", &["Syria", "Syrian Arab Republic"]),
    ("SZ", &["Eswatini", "Swaziland"]),
    (
        "TC",
        &["Turks and Caicos Islands", "Turks & Caicos Islands"],
    ),
    ("TD", &["Chad"]),
    ("TF", &["French Southern Territories"]),
    ("TG", &["Togo"]),
    ("TH", &["Thailand"]),
    ("TJ", &["Tajikistan"]),
    ("TK", &["Tokelau"]),
    ("TL", &["Timor-Leste", "East Timor", "Timor Leste"]),
    ("TM", &["Turkmenistan"]),
    ("TN", &["Tunisia"]),
    ("TO", &["Tonga"]),
    ("TR", &["Türkiye", "Turkey", "Turkiye"]),
    ("TT", &["Trinidad and Tobago", "Trinidad & Tobago"]),
    ("TV", &["Tuvalu"]),
    ("TW", &["Taiwan", "Taiwan, Province of China"]),
    (
        "TZ",
        &[
            "Tanzania",
            "United Republic of Tanzania",
            "Tanzania, United Republic of",
        ],
    ),
    ("UA", &["Ukraine"]),
    ("UG", &["Uganda"]),
    (
        "UM",
        &[
            "United States Minor Outlying Islands",
            "U.S. Outlying Islands",
        ],
    ),
    (
        "US",
        &[
            "United States",
            "United States of America",
            "USA",
            "U.S.",
            "U.S.A.",
        ],
    ),
    ("UY", &["Uruguay"]),
    ("UZ", &["Uzbekistan"]),
    ("VA", &["Vatican City", "Holy See", "Vatican"]),
    (
        "VC",
        &[
            "Saint Vincent and the Grenadines",
            "St. Vincent and the Grenadines",
            "St. Vincent & Grenadines",
        ],
    ),
    (
        "VE",
        &[
            "Venezuela",
            "Bolivarian Republic of Venezuela",
            "Venezuela, Bolivarian Republic of",
        ],
    ),
    ("VG", &["British Virgin Islands", "Virgin Islands, British"]),
    (
        "VI",
        &[
            "U.S. Virgin Islands",
            "US Virgin Islands",
            "Virgin Islands, U.S.",
        ],
    ),
    ("VN", &["Vietnam", "Viet Nam"]),
    ("VU", &["Vanuatu"]),
    ("WF", &["Wallis and Futuna", "Wallis & Futuna"]),
    ("WS", &["Samoa"]),
    ("XK", &["Kosovo"]),
    ("YE", &["Yemen"]),
    ("YT", &["Mayotte"]),
    ("ZA", &["South Africa"]),
    ("ZM", &["Zambia"]),
    ("ZW", &["Zimbabwe"]),
];

/// Longest name looked up; a longer field is not a country name.
pub const MAX_NAME: usize = 64;

/// The name as the table is keyed: ASCII letters lower-cased, blanks
/// collapsed, `&` read as `and`, and every other non-ASCII character (an
/// accented letter, or the replacement character lossy decoding left in
/// its place) as `?`, so `Türkiye`, `Turkiye` and `T\u{FFFD}rkiye` meet.
fn key(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for word in name.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        if word == "&" {
            out.push_str("and");
            continue;
        }
        for c in word.chars() {
            out.push(match c {
                c if c.is_ascii() => c.to_ascii_lowercase(),
                // Typographic apostrophes are common in `Côte d’Ivoire`.
                '\u{2019}' | '\u{2018}' => '\'',
                _ => '?',
            });
        }
    }
    out
}

/// Folds accented letters to their plain form, for the table's spellings
/// with accents (each is entered once, matched both ways).
fn plain(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' => 'a',
            'Å' => 'A',
            'ç' => 'c',
            'è' | 'é' | 'ê' | 'ë' => 'e',
            'í' | 'î' | 'ï' => 'i',
            'ñ' => 'n',
            'ó' | 'ô' | 'õ' | 'ö' => 'o',
            'ú' | 'û' | 'ü' => 'u',
            c => c,
        })
        .collect()
}

fn table() -> &'static HashMap<String, Country> {
    static TABLE: OnceLock<HashMap<String, Country>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut map = HashMap::new();
        for (code, names) in NAMES {
            let country = Country::parse(code).expect("two letters");
            for name in *names {
                map.insert(key(name), country);
                map.insert(key(&plain(name)), country);
            }
        }
        map
    })
}

/// The country an English name means, `None` for anything else (and for
/// "Unknown"). A leading "the" is ignored (`The Gambia`, `the Netherlands`).
pub fn by_name(name: &str) -> Option<Country> {
    let name = name.trim();
    if name.len() > MAX_NAME || name.is_empty() {
        return None;
    }
    let k = key(name);
    let t = table();
    if let Some(c) = t.get(&k) {
        return Some(*c);
    }
    k.strip_prefix("the ").and_then(|rest| t.get(rest)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(name: &str) -> Option<String> {
        by_name(name).map(|c| c.to_string())
    }

    #[test]
    fn names_seen_in_public_lists() {
        for (name, want) in [
            ("The Netherlands", "NL"),
            ("United States", "US"),
            ("Hong Kong", "HK"),
            ("Congo (DRC)", "CD"),
            ("South Korea", "KR"),
            ("Türkiye", "TR"),
            ("T\u{FFFD}rkiye", "TR"),
            ("R\u{FFFD}union", "RE"),
            ("Cura\u{FFFD}ao", "CW"),
            ("Curacao", "CW"),
            ("Côte d’Ivoire", "CI"),
            ("cote d'ivoire", "CI"),
            ("  czechia ", "CZ"),
            ("Trinidad & Tobago", "TT"),
            ("the Gambia", "GM"),
            ("Palestine", "PS"),
            ("North Macedonia", "MK"),
        ] {
            assert_eq!(cc(name).as_deref(), Some(want), "{name}");
        }
        for not in ["Unknown", "", "N/A", "Atlantis", "pass", "user", "Europe"] {
            assert_eq!(cc(not), None, "{not}");
        }
    }

    #[test]
    fn every_code_is_two_letters_and_every_name_is_one_country() {
        let mut seen: HashMap<String, &str> = HashMap::new();
        for (code, names) in NAMES {
            assert!(Country::parse(code).is_some(), "{code}");
            for name in *names {
                if let Some(other) = seen.insert(key(name), code) {
                    assert_eq!(other, *code, "{name} is listed twice");
                }
                assert_eq!(cc(name).as_deref(), Some(*code), "{name}");
            }
        }
        assert!(NAMES.len() >= 249, "{}", NAMES.len());
    }
}
