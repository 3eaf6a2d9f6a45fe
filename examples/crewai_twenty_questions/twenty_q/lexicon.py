"""Which attribute a free-text yes/no question asks about: phrases → attribute columns.

Each rule is a regular expression over the normalized question (lowercase, letters and digits
separated by single spaces) and a list of attributes tried in order; the first one that applies to
the secret's category answers (so "Is it alive?" reads `alive` for a person and `living` for an
animal). `!attribute` answers the opposite ("Does it have legs?" → not `no_legs`). When several
rules match, the longest matched phrase wins: "farm animal" beats "animal"; a rule marked `~` (the
broad kind words: animal, instrument, device...) only answers when nothing more specific matched,
so "Is it a brass instrument?" asks about brass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One phrase pattern and the attributes it asks about (`!name` negates)."""

    pattern: re.Pattern[str]
    attributes: tuple[str, ...]
    fallback: bool = False


def normalize(text: str) -> str:
    """Lowercase, every run of non-alphanumerics a single space, trimmed ("Man-made?" → "man made")."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower().replace("'", "")).split())


_RAW: list[tuple[str, str]] = [
    # what kind of thing
    ("living", r"living thing|living being|organism"),
    ("alive,living", r"alive|living(?! room)|still living|(is|are) (he|she|they) living"),
    ("!alive", r"dead|deceased|died|passed away|no longer alive"),
    ("~animal", r"animals?|creatures?|beasts?"),
    ("~person", r"persons?|humans?|human being|people|someone|somebody"),
    ("male", r"(a )?man(?! made)|male|boy|guy|he|him|gentleman"),
    ("female", r"woman|female|girl|lady|she|her"),
    ("~plant", r"plants?|vegetation|grows? in (the )?(ground|soil|garden)"),
    ("~flower", r"flowers?|blooms?|blossoms?|petals?"),
    ("~fictional", r"fictional|fiction|imaginary|made up|invented character|characters?|not real|cartoon character"),
    ("!fictional", r"real|exists?|existed|in real life|historical figure"),
    (
        "~man_made",
        r"man made|manufactured|artificial|human made|made by (humans|people)|objects?|items?|products?|inanimate",
    ),
    ("~celebrity", r"celebrit(y|ies)|famous|well known person|star"),
    ("~furniture", r"furniture|piece of furniture"),
    (
        "~electronic",
        r"electronics?|electric(al)?|electricity|devices?|gadgets?|appliances?|technology|tech|plug(ged)? in|powered",
    ),
    ("~instrument", r"(musical )?instruments?|make music|used for music|music(al)?"),
    ("plays_sound,instrument", r"play(s)? music|makes? (a )?sound|noise|loud"),
    ("singer,instrument", r"sing(s|er|ing)?|songs?|musician|band|pop star|rapper"),
    ("~stationery", r"stationery|office suppl(y|ies)|school suppl(y|ies)|desk suppl(y|ies)"),
    # size
    (
        "handheld",
        r"fit in (your|a|my|one) (hand|pocket)|hold (it )?in (your|one|a) hand|hand "
        r"?held|pocket|tiny|small|little|"
        r"smaller than (a |an )?(breadbox|bread box|shoebox|shoe box|football|basketball|loaf)",
    ),
    (
        "!handheld",
        r"bigger than (a |an )?(breadbox|bread box|shoebox|shoe box|football|basketball|loaf)|larger than (a |an "
        r")?(breadbox|bread box|shoebox|shoe box|football|basketball|loaf)|heavy|can you lift",
    ),
    (
        "larger_than_human",
        r"big|large|huge|giant|tall|(bigger|larger|taller) than (a |an )?(person|human|man|adult|you|me|people)",
    ),
    ("!larger_than_human", r"(smaller|shorter) than (a |an )?(person|human|man|adult|you|me)"),
    # colour
    ("red", r"red"),
    ("yellow", r"yellow|golden"),
    ("white", r"white"),
    ("pink", r"pink"),
    ("purple", r"purple|violet colou?r|lilac colou?r"),
    ("blue", r"blue"),
    ("orange", r"orange"),
    ("black", r"black"),
    ("green", r"green"),
    ("brown", r"brown|tan"),
    ("gray", r"gr[ae]y|silver"),
    # material
    ("wood", r"wood(en)?|timber"),
    ("metal", r"metal(lic)?|steel|iron|aluminium|aluminum"),
    ("brass,metal", r"brass"),
    ("plastic", r"plastic"),
    ("paper", r"paper|cardboard"),
    ("fabric", r"fabric|cloth|textile|upholster(ed|y)"),
    ("rubber", r"rubber"),
    # animals
    ("mammal", r"mammals?"),
    ("bird", r"birds?"),
    ("fish", r"fish"),
    ("reptile", r"reptiles?"),
    ("amphibian", r"amphibians?"),
    ("insect", r"insects?|bugs?"),
    ("pet", r"pets?|domestic(ated)?|house ?hold pet"),
    ("farm_animal", r"farms?|farm animal|livestock"),
    ("wild", r"wild|zoo|safari|wildlife"),
    (
        "lives_in_water,grows_in_water",
        r"(live|lives|living|found|grows?) (in|under|near) (the "
        r")?(water|sea|ocean|pond|lake|river)|aquatic|marine|underwater|water",
    ),
    ("ocean", r"ocean|sea"),
    ("swims", r"swim(s|ming)?|good swimmer"),
    ("can_fly", r"fly|flies|flying|flight|airborne|in the air"),
    ("has_wings", r"wings?"),
    ("fur,personal_care", r"fur(ry)?|hair(y)?|wool"),
    ("feathers", r"feathers?|feathered"),
    ("scales", r"scales|scaly"),
    ("shell", r"shell"),
    ("four_legs", r"four legs|4 legs|four legged|walk on all fours"),
    ("six_legs", r"six legs|6 legs"),
    ("!no_legs,has_legs", r"legs?"),
    (
        "eats_meat",
        r"(eat|eats|eating) (meat|other animals|fish|insects|bugs)|carnivor(e|ous)|predator|hunts?|omnivor(e|ous)",
    ),
    ("herbivore", r"herbivor(e|ous)|(eat|eats|eating) (only )?(plants|grass|leaves|vegetables|nectar)|vegetarian"),
    ("stripes", r"strip(e|es|ed)"),
    ("spots", r"spots?|spotted"),
    ("horns", r"horns?|antlers?"),
    ("trunk", r"trunk"),
    ("long_neck", r"long neck"),
    ("nocturnal", r"nocturnal|at night|night"),
    ("lays_eggs", r"eggs?"),
    ("venomous", r"venom(ous)?|poison(ous)?|sting(s)?"),
    ("dangerous", r"dangerous|deadly|kill|attack|bite|harm|scary|fierce"),
    ("hops", r"hops?|jumps?|hopping|jumping"),
    ("big_cat", r"big cat|feline|cat family"),
    ("marsupial", r"marsupial|pouch"),
    ("africa", r"africa(n)?"),
    ("asia", r"asia(n)?|india(n)?|chin(a|ese)"),
    ("australia", r"australia(n)?"),
    ("arctic", r"arctic|polar|north pole|cold (place|climate|region)|ice|snow"),
    # people
    ("actor,in_movies", r"act(s|or|ors|ress|ing)?|hollywood"),
    ("athlete", r"athlet(e|es|ic)|sports?|sportsman|sportswoman|player|plays? a sport"),
    ("olympic_medal", r"olympics?|olympic medal|gold medal|medal"),
    ("politician", r"politic(s|al|ian)|leader|government|activist|civil rights"),
    ("president,politician", r"presidents?"),
    ("scientist", r"scien(ce|tist|tific)|physic(s|ist)|chemist(ry)?|inventor|invent(ed)?|discover(ed|y)?"),
    ("artist", r"artist|paint(er|ing|ed|s)?|art"),
    ("writer,from_book", r"writ(er|es|ten|ing)|author|poet|playwright|novelist|wrote"),
    ("business", r"business(man|woman)?|entrepreneur|ceo|compan(y|ies)|founder|billionaire|rich|tech company"),
    ("royalty", r"royal(ty)?|king|queen|prince(ss)?|monarch|crown"),
    ("american", r"americ(a|an)|usa|united states|u s"),
    ("british", r"british|brit(ain)?|england|english|uk|united kingdom|london|scotland|scottish"),
    ("europe", r"europe(an)?|germany|german|france|french|italy|italian|spain|spanish|poland|polish|portugal"),
    ("south_america", r"south americ(a|an)|argentin(a|ian|e)|brazil(ian)?|latin americ(a|an)"),
    (
        "born_before_1950",
        r"born before (19|18)\d\d|old(er)?|historic(al)?|(19th|18th|17th|16th|15th) century|long ago|ancient",
    ),
    ("nobel_prize", r"nobel( prize)?"),
    ("oscar", r"oscars?|academy awards?"),
    ("soccer", r"soccer|football"),
    ("basketball", r"basketball|nba"),
    ("tennis", r"tennis"),
    ("runner", r"runner|running|sprint(er|ing)?|track|race|fastest"),
    # fictional characters
    ("superhero", r"super ?heroes|super ?hero|hero"),
    ("superpowers", r"super ?powers?|powers?|special abilit(y|ies)"),
    ("villain", r"villains?|evil|bad guy|antagonist"),
    ("magic", r"magic(al)?|spells?|witch(craft)?|sorcer(er|y)"),
    ("wizard,magic", r"wizards?"),
    ("from_book,writer", r"books?|novels?|literature|story ?book"),
    ("from_comics", r"comics?|comic books?"),
    ("in_movies,actor", r"movies?|films?|cinema"),
    ("animated", r"cartoons?|animated|animation|anime"),
    ("video_game,gaming", r"video games?|games?|gaming|nintendo|console"),
    ("disney", r"disney"),
    ("marvel", r"marvel"),
    ("dc", r"dc( comics)?"),
    ("star_wars", r"star wars|jedi|sith"),
    ("wears_cape", r"capes?|cloak"),
    # furniture
    ("for_sitting", r"sit(ting)?|seat(ing)?|sit on"),
    ("for_sleeping", r"sleep(ing)?|lie down|lay down|nap"),
    ("for_storage", r"stor(e|age|ing)|keep (things|stuff|items)|put (things|stuff) in|contain(er)?"),
    ("has_drawers", r"drawers?"),
    ("has_doors", r"doors?"),
    ("cushioned", r"soft|cushion(s|ed)?|padded|comfortable|comfy"),
    ("has_wheels", r"wheels?|roll"),
    ("rocks_or_swings", r"rocks?|rocking|swings?|swinging|sway"),
    ("for_babies", r"bab(y|ies)|infants?|toddlers?|child(ren)?|kids?"),
    ("bedroom", r"bedroom"),
    ("living_room", r"living room|lounge|family room|den"),
    ("dining_room", r"dining|meals?|eat (at|on)"),
    ("kitchen", r"kitchen|cook(ing)?|food"),
    ("office", r"offices?|workplace|at work|for work"),
    ("outdoor", r"outdoors?|outside|garden|park|yard|patio"),
    ("flat_top", r"flat (top|surface)|surface|put things on|table ?top"),
    ("holds_books", r"hold(s)? books|books on it"),
    ("hangs_clothes", r"clothes|clothing|coats?|hang(s|ing)?"),
    # electronics
    ("has_screen", r"screens?|display|monitor|touch ?screen"),
    ("battery", r"batter(y|ies)|rechargeable|charg(e|ed|ing)|cordless|wireless"),
    ("internet", r"internet|wi ?fi|online|network|connect(s|ed)? to (the )?internet|smart"),
    ("makes_calls", r"(make|makes|making) (phone )?calls|call people|phone calls|telephone"),
    ("takes_photos", r"photos?|pictures?|camera|photograph(s|y)?|record video"),
    ("gaming,video_game", r"play games|gaming"),
    ("has_keys,keyboard_instrument", r"keys|buttons?|typ(e|ing)"),
    ("wearable", r"wear(able|s)?|worn|on (your|the) (wrist|head|body|ears)"),
    ("cleaning", r"clean(s|ing)?|wash(es|ing)?|vacuum"),
    ("large_appliance", r"large appliance|big appliance|major appliance|white goods"),
    ("computer", r"computers?|computing"),
    ("heats", r"heat(s|ing)?|hot|warm|toast"),
    ("cools,arctic", r"cool(s|ing)?|cold|freez(e|es|ing|er)|chill"),
    ("computer_accessory", r"accessor(y|ies)|peripheral|connect(s|ed)? to (a )?computer|used with (a )?computer"),
    ("personal_care", r"personal care|hygiene|groom(ing)?|teeth|tooth|dry (your )?hair"),
    ("bathroom", r"bathroom"),
    ("has_motor,has_moving_parts", r"motor|engine|moving parts|mechanical|spins?"),
    # instruments
    ("strings", r"strings?|stringed"),
    ("woodwind", r"woodwinds?"),
    ("percussion", r"percussion|drums?"),
    ("keyboard_instrument,has_keys", r"keyboard instrument|keyboard|piano keys"),
    ("bowed", r"bow(ed)?"),
    ("plucked", r"pluck(ed|ing)?|strum(med|ming)?|fingers"),
    ("electric_instrument,electronic", r"amplifier|amp|plugged"),
    ("blown", r"blow(n|ing|s)?|wind instrument|breath|mouth|lips"),
    ("reed", r"reeds?"),
    ("orchestra", r"orchestr(a|al)|classical|symphon(y|ic)"),
    ("struck", r"hit|strike|struck|bang|beat|tap|mallets?|sticks"),
    ("pedals", r"pedals?|feet|foot"),
    ("six_strings", r"six strings|6 strings"),
    ("four_strings", r"four strings|4 strings"),
    ("bellows", r"bellows|squeeze"),
    # flowers
    ("fragrant", r"smell(s|y)?|fragran(t|ce)|scent(ed)?|perfume|aroma"),
    ("grows_on_tree", r"trees?"),
    ("shrub", r"shrubs?|bush(es)?"),
    ("bulb", r"bulbs?"),
    ("thorns,sharp", r"thorn(s|y)?|prick(ly|les)|spik(y|es)"),
    ("tropical", r"tropic(s|al)|hot climate|rainforest|jungle"),
    ("weed", r"weeds?"),
    ("symbol_of_love", r"love|romance|romantic|valentine"),
    ("christmas", r"christmas|xmas|holiday"),
    ("japan", r"japan(ese)?"),
    ("netherlands", r"netherlands|holland|dutch"),
    ("large_flower", r"large flower|big flower|big bloom|large bloom"),
    ("spring", r"spring(time)?"),
    ("tea", r"tea|drink"),
    # stationery
    ("for_writing", r"writ(e|ing)|write with"),
    ("for_drawing", r"draw(ing)?|sketch|colou?ring"),
    ("uses_ink", r"ink"),
    ("erasable", r"eras(e|able|ed)|rub out"),
    ("cuts", r"cut(s|ting)?|slice"),
    ("sharp,thorns", r"sharp|pointy|pointed|blade|pierce"),
    ("holds_paper", r"hold(s)? (paper|papers|sheets)|fasten|attach|bind|keep papers|together|clip"),
    ("measures", r"measur(e|es|ing|ement)|length|angles?"),
    ("sticky", r"stick(y|s)?|adhesive|glue"),
    ("school", r"schools?|students?|classroom|pupils?"),
    ("has_cap", r"cap|lid"),
    ("geometry", r"geometry|math(s|ematics)?|circles?"),
    ("mail", r"mail|letters?|post(al)?|send"),
]

RULES: tuple[Rule, ...] = tuple(
    Rule(
        re.compile(rf"\b(?:{pattern})\b"),
        tuple(a.strip() for a in attributes.lstrip("~").split(",")),
        attributes.startswith("~"),
    )
    for attributes, pattern in _RAW
)


def matches(question: str) -> list[tuple[int, Rule]]:
    """The rules that match the normalized question: specific before broad, then longest phrase first."""
    text = normalize(question)
    found = []
    for rule in RULES:
        best = max((len(m.group(0)) for m in rule.pattern.finditer(text)), default=0)
        if best:
            found.append((best, rule))
    found.sort(key=lambda pair: (pair[1].fallback, -pair[0]))
    return found


def attribute_names() -> set[str]:
    """Every attribute the rules refer to (without the `!`), for checking them against the table."""
    return {a.lstrip("!") for rule in RULES for a in rule.attributes}
