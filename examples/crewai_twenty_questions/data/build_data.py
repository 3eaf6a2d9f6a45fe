"""Regenerate `entities.csv` and `attributes.csv` from the compact facts below.

    python examples/crewai_twenty_questions/data/build_data.py

The CSVs are the source of truth the game loads; this script is how they were written (closed
world: an attribute that applies to an entity's category and is not listed for it is "no", an
attribute that does not apply to the category is "n/a"). Edit the facts here, re-run, review the
CSV diff. The train/test split is fixed by a seeded shuffle inside each category (20 train, 5 test).
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPLIT_SEED = 17
TEST_PER_CATEGORY = 5

CATEGORIES = (
    "animals",
    "celebrities",
    "fictional characters",
    "furniture",
    "electronics",
    "instruments",
    "flowers",
    "stationery",
)
OBJECTS = ("furniture", "electronics", "instruments", "stationery")
LIVING = ("animals", "celebrities", "flowers")
ALL = CATEGORIES

# attribute -> the categories it applies to (a question about it elsewhere is answered "n/a").
APPLIES: dict[str, tuple[str, ...]] = {
    # what kind of thing
    "living": LIVING + OBJECTS,
    "animal": ALL,
    "person": ALL,
    "plant": ALL,
    "fictional": ALL,
    "man_made": ALL,
    "celebrity": ALL,
    "furniture": ALL,
    "electronic": ALL,
    "instrument": ALL,
    "flower": ALL,
    "stationery": ALL,
    # size
    "handheld": ALL,
    "larger_than_human": ALL,
    # colour (things whose colour is part of what they are)
    **{
        c: ("animals", "flowers", "fictional characters")
        for c in ("red", "yellow", "white", "pink", "purple", "blue", "orange", "black", "green", "brown", "gray")
    },
    # material
    **{m: OBJECTS for m in ("wood", "metal", "plastic", "paper", "fabric", "rubber")},
    # animals
    **{
        a: ("animals",)
        for a in (
            "mammal",
            "bird",
            "fish",
            "reptile",
            "amphibian",
            "insect",
            "pet",
            "farm_animal",
            "wild",
            "lives_in_water",
            "swims",
            "has_wings",
            "fur",
            "feathers",
            "scales",
            "shell",
            "four_legs",
            "six_legs",
            "no_legs",
            "eats_meat",
            "herbivore",
            "stripes",
            "spots",
            "horns",
            "trunk",
            "long_neck",
            "nocturnal",
            "lays_eggs",
            "venomous",
            "dangerous",
            "hops",
            "big_cat",
            "marsupial",
            "australia",
            "arctic",
            "ocean",
        )
    },
    # people
    **{
        a: ("celebrities",)
        for a in (
            "alive",
            "actor",
            "singer",
            "athlete",
            "politician",
            "president",
            "scientist",
            "artist",
            "writer",
            "business",
            "american",
            "europe",
            "south_america",
            "born_before_1950",
            "nobel_prize",
            "oscar",
            "olympic_medal",
            "soccer",
            "basketball",
            "tennis",
            "runner",
        )
    },
    "male": ("celebrities", "fictional characters"),
    "female": ("celebrities", "fictional characters"),
    "royalty": ("celebrities", "fictional characters"),
    "british": ("celebrities", "fictional characters"),
    "can_fly": ("animals", "fictional characters", "electronics"),
    "africa": ("animals", "celebrities"),
    "asia": ("animals", "celebrities"),
    "kitchen": ("furniture", "electronics"),
    "office": ("furniture", "stationery"),
    "school": ("stationery",),
    # fictional characters
    **{
        a: ("fictional characters",)
        for a in (
            "superhero",
            "superpowers",
            "villain",
            "magic",
            "from_book",
            "from_comics",
            "in_movies",
            "animated",
            "video_game",
            "disney",
            "marvel",
            "dc",
            "star_wars",
            "wears_cape",
            "wizard",
        )
    },
    # furniture
    **{
        a: ("furniture",)
        for a in (
            "for_sitting",
            "for_sleeping",
            "for_storage",
            "has_drawers",
            "has_doors",
            "has_legs",
            "cushioned",
            "has_wheels",
            "rocks_or_swings",
            "for_babies",
            "bedroom",
            "living_room",
            "dining_room",
            "outdoor",
            "flat_top",
            "holds_books",
            "hangs_clothes",
        )
    },
    # electronics
    **{
        a: ("electronics",)
        for a in (
            "has_screen",
            "battery",
            "internet",
            "makes_calls",
            "plays_sound",
            "takes_photos",
            "gaming",
            "has_keys",
            "wearable",
            "cleaning",
            "large_appliance",
            "computer",
            "heats",
            "cools",
            "computer_accessory",
            "personal_care",
            "bathroom",
            "has_motor",
        )
    },
    # instruments
    **{
        a: ("instruments",)
        for a in (
            "strings",
            "woodwind",
            "brass",
            "percussion",
            "keyboard_instrument",
            "bowed",
            "plucked",
            "electric_instrument",
            "blown",
            "reed",
            "orchestra",
            "struck",
            "pedals",
            "six_strings",
            "four_strings",
            "bellows",
        )
    },
    # flowers
    **{
        a: ("flowers",)
        for a in (
            "fragrant",
            "grows_on_tree",
            "shrub",
            "bulb",
            "grows_in_water",
            "thorns",
            "tropical",
            "weed",
            "symbol_of_love",
            "christmas",
            "japan",
            "netherlands",
            "large_flower",
            "spring",
            "tea",
        )
    },
    # stationery
    **{
        a: ("stationery",)
        for a in (
            "for_writing",
            "for_drawing",
            "uses_ink",
            "erasable",
            "cuts",
            "sharp",
            "holds_paper",
            "measures",
            "sticky",
            "has_cap",
            "geometry",
            "mail",
            "has_moving_parts",
        )
    },
}

ANIMALS = {
    "dog": ("puppy", "mammal pet fur four_legs eats_meat swims brown black white"),
    "cat": ("kitten", "mammal pet fur four_legs eats_meat black white orange gray"),
    "horse": ("pony", "mammal farm_animal fur four_legs herbivore swims larger_than_human brown black white"),
    "cow": ("cattle", "mammal farm_animal fur four_legs herbivore horns larger_than_human black white brown spots"),
    "pig": ("hog", "mammal farm_animal four_legs eats_meat pink"),
    "sheep": ("lamb", "mammal farm_animal fur four_legs herbivore white"),
    "chicken": ("hen|rooster", "bird farm_animal feathers has_wings lays_eggs eats_meat white brown red"),
    "elephant": ("", "mammal wild four_legs herbivore trunk africa asia swims larger_than_human gray"),
    "giraffe": ("", "mammal wild four_legs herbivore long_neck spots horns africa larger_than_human yellow brown"),
    "lion": ("", "mammal wild fur four_legs eats_meat big_cat africa dangerous larger_than_human yellow brown"),
    "tiger": (
        "",
        "mammal wild fur four_legs eats_meat big_cat stripes asia swims dangerous larger_than_human orange black white",
    ),
    "zebra": ("", "mammal wild fur four_legs herbivore stripes africa larger_than_human black white"),
    "kangaroo": ("", "mammal wild fur herbivore hops marsupial australia brown"),
    "penguin": ("", "bird wild feathers has_wings lays_eggs eats_meat swims lives_in_water ocean black white"),
    "dolphin": ("", "mammal wild eats_meat swims lives_in_water ocean no_legs gray"),
    "shark": ("", "fish wild scales eats_meat swims lives_in_water ocean no_legs dangerous larger_than_human gray"),
    "eagle": ("bald eagle", "bird wild feathers has_wings can_fly lays_eggs eats_meat brown white"),
    "owl": ("", "bird wild feathers has_wings can_fly lays_eggs eats_meat nocturnal brown white"),
    "frog": ("", "amphibian wild four_legs lays_eggs eats_meat swims lives_in_water hops handheld green"),
    "snake": ("serpent", "reptile wild scales no_legs lays_eggs eats_meat venomous dangerous green brown"),
    "crocodile": (
        "croc",
        "reptile wild scales four_legs lays_eggs eats_meat swims lives_in_water dangerous africa asia australia "
        "larger_than_human green",
    ),
    "turtle": ("tortoise", "reptile wild scales shell four_legs lays_eggs swims lives_in_water green brown"),
    "bee": (
        "honeybee|honey bee|bumblebee",
        "insect has_wings can_fly six_legs lays_eggs herbivore venomous stripes handheld yellow black",
    ),
    "butterfly": ("", "insect wild has_wings can_fly six_legs lays_eggs herbivore handheld orange yellow blue white"),
    "polar bear": ("", "mammal wild fur four_legs eats_meat swims arctic dangerous larger_than_human white"),
}

CELEBRITIES = {
    "Albert Einstein": ("einstein", "male scientist europe born_before_1950 nobel_prize"),
    "Marie Curie": ("curie", "female scientist europe born_before_1950 nobel_prize"),
    "Isaac Newton": ("newton", "male scientist british europe born_before_1950"),
    "William Shakespeare": ("shakespeare", "male writer british europe born_before_1950"),
    "Leonardo da Vinci": ("da vinci", "male artist scientist europe born_before_1950"),
    "Pablo Picasso": ("picasso", "male artist europe born_before_1950"),
    "Barack Obama": ("obama", "male alive politician president american nobel_prize"),
    "Abraham Lincoln": ("lincoln", "male politician president american born_before_1950"),
    "Nelson Mandela": ("mandela", "male politician president africa born_before_1950 nobel_prize"),
    "Queen Elizabeth II": ("elizabeth ii|queen elizabeth", "female royalty british europe born_before_1950"),
    "Mahatma Gandhi": ("gandhi", "male politician asia born_before_1950"),
    "Martin Luther King Jr.": ("martin luther king|mlk", "male politician american born_before_1950 nobel_prize"),
    "Taylor Swift": ("", "female alive singer american"),
    "Beyonce": ("beyoncé|beyonce knowles", "female alive singer actor american"),
    "Michael Jackson": ("", "male singer american"),
    "Elvis Presley": ("elvis", "male singer actor american born_before_1950"),
    "Tom Hanks": ("", "male alive actor american oscar"),
    "Leonardo DiCaprio": ("dicaprio", "male alive actor american oscar"),
    "Marilyn Monroe": ("", "female actor american born_before_1950"),
    "Charlie Chaplin": ("chaplin", "male actor british europe born_before_1950"),
    "Michael Jordan": ("", "male alive athlete basketball american olympic_medal"),
    "Serena Williams": ("", "female alive athlete tennis american olympic_medal"),
    "Usain Bolt": ("", "male alive athlete runner olympic_medal"),
    "Lionel Messi": ("messi", "male alive athlete soccer south_america olympic_medal"),
    "Steve Jobs": ("", "male business american"),
}

FICTIONAL = {
    "Harry Potter": ("", "person male magic wizard from_book in_movies british"),
    "Hermione Granger": ("hermione", "person female magic from_book in_movies british"),
    "Sherlock Holmes": ("sherlock", "person male from_book in_movies british"),
    "James Bond": ("007", "person male from_book in_movies british"),
    "Mickey Mouse": ("mickey", "animal male animated disney in_movies black"),
    "Winnie the Pooh": ("pooh|pooh bear", "animal male from_book animated disney in_movies british yellow"),
    "Superman": (
        "clark kent",
        "person male superhero superpowers from_comics dc in_movies wears_cape can_fly blue red",
    ),
    "Batman": ("bruce wayne", "person male superhero from_comics dc in_movies wears_cape black"),
    "Spider-Man": (
        "spiderman|spider man|peter parker",
        "person male superhero superpowers from_comics marvel in_movies red blue",
    ),
    "Wonder Woman": ("diana prince", "person female superhero superpowers from_comics dc in_movies royalty"),
    "Darth Vader": ("vader|anakin skywalker", "person male villain in_movies star_wars wears_cape black"),
    "Yoda": ("", "male in_movies star_wars green"),
    "Mario": ("super mario", "person male video_game in_movies animated red"),
    "Pikachu": ("", "animal video_game animated in_movies superpowers yellow"),
    "Sonic the Hedgehog": ("sonic", "animal male video_game animated in_movies superpowers blue"),
    "Shrek": ("", "male animated in_movies royalty green"),
    "Elsa": ("queen elsa", "person female magic animated disney in_movies royalty"),
    "Cinderella": ("", "person female animated disney in_movies royalty from_book"),
    "Simba": ("", "animal male animated disney in_movies royalty yellow"),
    "SpongeBob SquarePants": ("spongebob|sponge bob", "animal male animated in_movies yellow"),
    "Bugs Bunny": ("", "animal male animated in_movies gray"),
    "Homer Simpson": ("homer", "person male animated in_movies yellow"),
    "Gandalf": ("gandalf the grey", "person male magic wizard from_book in_movies gray"),
    "Dracula": ("count dracula", "male villain magic from_book in_movies wears_cape"),
    "Peter Pan": ("", "person male from_book animated disney in_movies can_fly british green"),
}

FURNITURE = {
    "chair": ("", "for_sitting has_legs dining_room wood"),
    "table": ("", "has_legs flat_top dining_room kitchen wood"),
    "sofa": ("couch|settee", "for_sitting cushioned living_room fabric larger_than_human"),
    "bed": ("", "for_sleeping has_legs cushioned bedroom wood larger_than_human"),
    "desk": ("writing desk", "has_legs has_drawers flat_top office wood"),
    "bookshelf": ("bookcase|book shelf", "for_storage holds_books living_room office wood larger_than_human"),
    "wardrobe": ("closet|armoire", "for_storage has_doors hangs_clothes bedroom wood larger_than_human"),
    "dresser": ("chest of drawers|bureau", "for_storage has_drawers bedroom wood"),
    "stool": ("bar stool", "for_sitting has_legs kitchen wood metal"),
    "bench": ("park bench", "for_sitting has_legs outdoor wood metal"),
    "armchair": ("", "for_sitting cushioned living_room fabric"),
    "ottoman": ("footstool|pouf", "for_sitting cushioned living_room fabric"),
    "nightstand": ("bedside table|night table", "for_storage has_drawers has_legs flat_top bedroom wood"),
    "coffee table": ("", "has_legs flat_top living_room wood"),
    "recliner": ("reclining chair", "for_sitting cushioned living_room fabric"),
    "rocking chair": ("rocker", "for_sitting has_legs rocks_or_swings living_room outdoor wood"),
    "hammock": ("", "for_sleeping rocks_or_swings outdoor fabric larger_than_human"),
    "crib": ("cot|baby bed", "for_sleeping for_babies has_legs bedroom wood"),
    "bunk bed": ("bunkbed|bunk beds", "for_sleeping has_legs bedroom wood metal larger_than_human"),
    "futon": ("", "for_sitting for_sleeping cushioned living_room fabric larger_than_human"),
    "cabinet": ("cupboard", "for_storage has_doors kitchen wood"),
    "dining table": ("kitchen table", "has_legs flat_top dining_room wood larger_than_human"),
    "office chair": ("desk chair|swivel chair", "for_sitting cushioned has_wheels office plastic metal fabric"),
    "bean bag": ("bean bag chair|beanbag", "for_sitting cushioned living_room fabric"),
    "coat rack": ("coat stand|hat stand", "hangs_clothes has_legs living_room wood metal"),
}

ELECTRONICS = {
    "smartphone": (
        "phone|cell phone|mobile phone|iphone",
        "has_screen battery internet makes_calls plays_sound takes_photos gaming computer handheld plastic metal",
    ),
    "laptop": (
        "notebook computer|laptop computer",
        "has_screen battery internet has_keys computer gaming plays_sound plastic metal",
    ),
    "television": ("tv|tv set", "has_screen internet plays_sound plastic"),
    "tablet": ("ipad", "has_screen battery internet plays_sound takes_photos gaming computer plastic metal"),
    "smartwatch": ("smart watch|apple watch", "has_screen battery internet wearable handheld plastic metal"),
    "headphones": ("earphones|headset|earbuds", "battery plays_sound wearable handheld plastic"),
    "digital camera": ("camera", "has_screen battery takes_photos handheld plastic metal"),
    "microwave oven": ("microwave", "kitchen heats plastic metal"),
    "refrigerator": ("fridge", "kitchen cools large_appliance has_motor metal larger_than_human"),
    "washing machine": ("washer", "cleaning large_appliance has_motor metal"),
    "video game console": ("game console|playstation|xbox|nintendo", "internet gaming plastic"),
    "desktop computer": ("desktop|pc|personal computer", "internet computer gaming plastic metal"),
    "printer": ("", "computer_accessory plastic"),
    "wifi router": ("router|wireless router", "internet computer_accessory plastic"),
    "remote control": ("remote|tv remote", "battery has_keys handheld plastic"),
    "bluetooth speaker": ("speaker|wireless speaker", "battery plays_sound handheld plastic"),
    "e-reader": ("kindle|ebook reader|e reader", "has_screen battery internet handheld plastic"),
    "drone": ("quadcopter", "battery takes_photos can_fly has_motor plastic"),
    "robot vacuum": ("roomba|robotic vacuum", "battery cleaning has_motor internet plastic"),
    "hair dryer": ("hairdryer|blow dryer", "heats personal_care bathroom has_motor plastic"),
    "calculator": ("pocket calculator", "has_screen battery has_keys handheld plastic"),
    "computer mouse": ("mouse", "computer_accessory handheld plastic"),
    "computer keyboard": ("keyboard", "has_keys computer_accessory plastic"),
    "electric toothbrush": ("", "battery personal_care bathroom has_motor handheld plastic"),
    "toaster": ("", "kitchen heats metal"),
}

INSTRUMENTS = {
    "piano": ("grand piano", "strings keyboard_instrument struck pedals orchestra wood larger_than_human"),
    "acoustic guitar": ("guitar", "strings plucked six_strings wood"),
    "electric guitar": ("", "strings plucked six_strings electric_instrument wood"),
    "violin": ("fiddle", "strings bowed four_strings orchestra wood"),
    "cello": ("violoncello", "strings bowed four_strings orchestra wood"),
    "double bass": (
        "upright bass|contrabass|string bass",
        "strings bowed plucked four_strings orchestra wood larger_than_human",
    ),
    "harp": ("", "strings plucked pedals orchestra wood larger_than_human"),
    "drum kit": ("drums|drum set|drum", "percussion struck pedals wood metal"),
    "flute": ("", "woodwind blown orchestra metal"),
    "clarinet": ("", "woodwind blown reed orchestra wood"),
    "saxophone": ("sax", "woodwind blown reed metal"),
    "oboe": ("", "woodwind blown reed orchestra wood"),
    "trumpet": ("", "brass blown orchestra metal"),
    "trombone": ("", "brass blown orchestra metal"),
    "tuba": ("", "brass blown orchestra metal"),
    "french horn": ("horn", "brass blown orchestra metal"),
    "harmonica": ("mouth organ", "blown reed handheld metal"),
    "accordion": ("", "keyboard_instrument reed bellows"),
    "bagpipes": ("bagpipe", "woodwind blown reed"),
    "ukulele": ("uke", "strings plucked four_strings wood"),
    "banjo": ("", "strings plucked wood metal"),
    "xylophone": ("", "percussion struck orchestra wood"),
    "tambourine": ("", "percussion struck handheld wood metal"),
    "triangle": ("", "percussion struck orchestra handheld metal"),
    "synthesizer": ("synth", "keyboard_instrument electric_instrument plastic"),
}

FLOWERS = {
    "rose": ("roses", "shrub thorns fragrant symbol_of_love red pink white yellow"),
    "tulip": ("tulips", "bulb spring netherlands red yellow pink purple white orange"),
    "sunflower": ("sunflowers", "large_flower yellow"),
    "daisy": ("daisies", "white yellow"),
    "lily": ("lilies", "bulb fragrant large_flower white pink orange"),
    "orchid": ("orchids", "tropical purple pink white"),
    "daffodil": ("daffodils|narcissus", "bulb spring yellow white"),
    "lavender": ("", "shrub fragrant tea purple"),
    "carnation": ("carnations", "fragrant pink red white"),
    "chrysanthemum": ("mum|mums|chrysanthemums", "tea japan yellow white purple"),
    "marigold": ("marigolds", "orange yellow"),
    "poppy": ("poppies", "red orange"),
    "iris": ("irises", "bulb spring purple blue"),
    "hibiscus": ("", "shrub tropical large_flower tea red pink"),
    "lotus": ("lotus flower", "grows_in_water large_flower pink white"),
    "jasmine": ("", "shrub fragrant tea white"),
    "peony": ("peonies", "large_flower fragrant spring pink red white"),
    "dandelion": ("dandelions", "weed tea yellow"),
    "violet": ("violets", "spring fragrant purple"),
    "magnolia": ("magnolias", "grows_on_tree large_flower fragrant spring white pink"),
    "cherry blossom": ("sakura|cherry blossoms", "grows_on_tree spring japan pink white"),
    "hydrangea": ("hydrangeas", "shrub large_flower blue pink purple white"),
    "lilac": ("lilacs", "shrub fragrant spring purple"),
    "poinsettia": ("poinsettias", "shrub tropical christmas red"),
    "bluebell": ("bluebells", "bulb spring blue"),
}

STATIONERY = {
    "pencil": ("", "office for_writing for_drawing erasable school wood handheld"),
    "ballpoint pen": ("pen|biro", "office for_writing uses_ink school has_cap plastic handheld"),
    "fountain pen": ("", "office for_writing uses_ink has_cap metal handheld"),
    "eraser": ("rubber eraser", "office school rubber handheld"),
    "ruler": ("", "office measures geometry school plastic wood"),
    "stapler": ("", "office holds_paper has_moving_parts metal handheld"),
    "notebook": ("exercise book|notepad", "office school paper handheld"),
    "paper clip": ("paperclip", "office holds_paper metal handheld"),
    "scissors": ("pair of scissors", "office cuts sharp has_moving_parts school metal plastic handheld"),
    "glue stick": ("glue", "office sticky school has_cap plastic handheld"),
    "highlighter": ("highlighter pen", "office uses_ink has_cap plastic handheld"),
    "marker": (
        "felt-tip pen|felt tip pen|marker pen",
        "office for_writing for_drawing uses_ink has_cap school plastic handheld",
    ),
    "envelope": ("", "office mail paper handheld"),
    "sticky note": ("post-it|post-it note|sticky notes", "office sticky paper handheld"),
    "adhesive tape": ("tape|sticky tape|scotch tape", "office sticky holds_paper plastic handheld"),
    "crayon": ("crayons", "for_drawing school handheld"),
    "pencil sharpener": ("sharpener", "office sharp school plastic metal handheld"),
    "ring binder": ("binder", "office holds_paper has_moving_parts plastic metal"),
    "folder": ("file folder", "office holds_paper paper"),
    "thumbtack": ("drawing pin|push pin|pushpin", "office sharp holds_paper metal handheld"),
    "rubber band": ("elastic band", "office holds_paper rubber handheld"),
    "compass": (
        "drawing compass|pair of compasses",
        "for_drawing geometry sharp has_moving_parts school metal handheld",
    ),
    "protractor": ("", "measures geometry school plastic handheld"),
    "hole punch": ("paper punch|hole puncher", "office cuts has_moving_parts metal"),
    "clipboard": ("", "office holds_paper has_moving_parts wood metal"),
}

BY_CATEGORY = {
    "animals": ANIMALS,
    "celebrities": CELEBRITIES,
    "fictional characters": FICTIONAL,
    "furniture": FURNITURE,
    "electronics": ELECTRONICS,
    "instruments": INSTRUMENTS,
    "flowers": FLOWERS,
    "stationery": STATIONERY,
}

# Facts that follow from the category alone (the per-entity tags above may add to them).
CATEGORY_FACTS = {
    "animals": "animal living",
    "celebrities": "person celebrity living",
    "fictional characters": "fictional",
    "furniture": "man_made furniture",
    "electronics": "man_made electronic",
    "instruments": "man_made instrument",
    "flowers": "plant flower living",
    "stationery": "man_made stationery",
}

# Tags above that are spelled for the reader and stored under another attribute.
RENAMES = {}


def facts_of(category: str, tags: str) -> set[str]:
    """The attributes that are true for one entity."""
    facts = set(CATEGORY_FACTS[category].split()) | {RENAMES.get(t, t) for t in tags.split()}
    if category == "celebrities" and "alive" not in facts:
        facts.discard("living")  # a deceased person is not a living thing
    if category == "instruments" and "electric_instrument" in facts:
        facts.add("electronic")
    if category == "animals" and "wild" not in facts and not facts & {"pet", "farm_animal"}:
        facts.add("wild")
    return facts


def value(attribute: str, category: str, facts: set[str]) -> str:
    """yes / no / n/a for one cell."""
    if category not in APPLIES[attribute]:
        return "n/a"
    return "yes" if attribute in facts else "no"


def main(out_dir: Path = HERE) -> None:
    """Write both CSVs into `out_dir` (next to this script by default)."""
    attributes = list(APPLIES)
    entity_rows, attribute_rows = [], []
    rng = random.Random(SPLIT_SEED)
    for category in CATEGORIES:
        entries = BY_CATEGORY[category]
        names = list(entries)
        test = set(rng.sample(names, TEST_PER_CATEGORY))
        for name in names:
            aliases, tags = entries[name]
            facts = facts_of(category, tags)
            unknown = facts - set(attributes)
            if unknown:
                raise SystemExit(f"{name}: unknown attributes {sorted(unknown)}")
            entity_rows.append(
                {"name": name, "category": category, "split": "test" if name in test else "train", "aliases": aliases}
            )
            attribute_rows.append({"name": name, **{a: value(a, category, facts) for a in attributes}})
    with (out_dir / "entities.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["name", "category", "split", "aliases"])
        writer.writeheader()
        writer.writerows(entity_rows)
    with (out_dir / "attributes.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["name", *attributes])
        writer.writeheader()
        writer.writerows(attribute_rows)
    print(f"{len(entity_rows)} entities, {len(attributes)} attributes")


if __name__ == "__main__":
    main()
