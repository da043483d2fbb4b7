"""Who made it: famous books, paintings, inventions, discoveries and music with their makers (the v5 prompts).

Tried as a new user would, the default model answered "Who wrote Hamlet?" with a made-up capital: no plan ever
asked who made something. These tables hold works the teacher names right most of the time (tried greedily, it
named Shakespeare, Austen, Orwell, Homer, Leonardo, Bell and Rowling, and missed Don Quixote's and War and Peace's
authors); the generator keeps a reply only when it contains the maker's checked name, so a miss costs a retry, not
a wrong fact. A sixth or so of the works (``held_out(work, "creator")``) never occur in plans, for a probe.

Plain data, our own; "|"-separated like :mod:`tinychat.training.topic_lists`.
"""
from __future__ import annotations

import random
from typing import Callable

from . import topic_lists

# verb -> {work: maker}. A maker's checked names: its last word, or the part after "|" when that would be wrong.
MADE_BY = {
    "wrote": topic_lists.table("""
Hamlet=William Shakespeare|Romeo and Juliet=William Shakespeare|Macbeth=William Shakespeare|
Othello=William Shakespeare|King Lear=William Shakespeare|A Midsummer Night's Dream=William Shakespeare|
Pride and Prejudice=Jane Austen|Sense and Sensibility=Jane Austen|Emma=Jane Austen|1984=George Orwell|
Animal Farm=George Orwell|The Odyssey=Homer|The Iliad=Homer|Harry Potter=J.K. Rowling|The Hobbit=J.R.R. Tolkien|
The Lord of the Rings=J.R.R. Tolkien|Oliver Twist=Charles Dickens|A Christmas Carol=Charles Dickens|
Great Expectations=Charles Dickens|War and Peace=Leo Tolstoy|Anna Karenina=Leo Tolstoy|
Crime and Punishment=Fyodor Dostoevsky|Don Quixote=Miguel de Cervantes|Moby-Dick=Herman Melville|
The Adventures of Tom Sawyer=Mark Twain|Adventures of Huckleberry Finn=Mark Twain|Frankenstein=Mary Shelley|
Dracula=Bram Stoker|The Great Gatsby=F. Scott Fitzgerald|To Kill a Mockingbird=Harper Lee|
The Old Man and the Sea=Ernest Hemingway|Alice's Adventures in Wonderland=Lewis Carroll|
The Divine Comedy=Dante Alighieri|Les Misérables=Victor Hugo|The Cat in the Hat=Dr. Seuss|
Charlotte's Web=E. B. White|The Little Prince=Antoine de Saint-Exupéry|The Jungle Book=Rudyard Kipling|
Treasure Island=Robert Louis Stevenson|The Catcher in the Rye=J. D. Salinger|Jane Eyre=Charlotte Brontë|
Wuthering Heights=Emily Brontë|On the Origin of Species=Charles Darwin|The Raven=Edgar Allan Poe|
Little Women=Louisa May Alcott|The Chronicles of Narnia=C. S. Lewis|Gulliver's Travels=Jonathan Swift|
Robinson Crusoe=Daniel Defoe|The Very Hungry Caterpillar=Eric Carle|Matilda=Roald Dahl|
Charlie and the Chocolate Factory=Roald Dahl"""),
    "painted": topic_lists.table("""
the Mona Lisa=Leonardo da Vinci|The Last Supper=Leonardo da Vinci|The Starry Night=Vincent van Gogh|
Sunflowers=Vincent van Gogh|The Scream=Edvard Munch|Guernica=Pablo Picasso|The Persistence of Memory=Salvador Dalí|
Girl with a Pearl Earring=Johannes Vermeer|The Birth of Venus=Sandro Botticelli|
the ceiling of the Sistine Chapel=Michelangelo|Water Lilies=Claude Monet|The Night Watch=Rembrandt|
American Gothic=Grant Wood|The Creation of Adam=Michelangelo"""),
    "invented": topic_lists.table("""
the telephone=Alexander Graham Bell|the light bulb=Thomas Edison|the printing press=Johannes Gutenberg|
the airplane=the Wright brothers|the World Wide Web=Tim Berners-Lee|dynamite=Alfred Nobel|the radio=Guglielmo Marconi|
the phonograph=Thomas Edison|the steam engine=James Watt|
the polio vaccine=Jonas Salk|the smallpox vaccine=Edward Jenner|the periodic table=Dmitri Mendeleev"""),
    "discovered": topic_lists.table("""
penicillin=Alexander Fleming|gravity=Isaac Newton|radium=Marie Curie|polonium=Marie Curie|
the laws of motion=Isaac Newton|evolution by natural selection=Charles Darwin|
the moons of Jupiter=Galileo Galilei|the structure of DNA=Watson and Crick|the theory of relativity=Albert Einstein"""),
    "composed": topic_lists.table("""
the Fifth Symphony=Ludwig van Beethoven|Für Elise=Ludwig van Beethoven|The Magic Flute=Wolfgang Amadeus Mozart|
The Four Seasons=Antonio Vivaldi|Swan Lake=Pyotr Ilyich Tchaikovsky|The Nutcracker=Pyotr Ilyich Tchaikovsky|
the Moonlight Sonata=Ludwig van Beethoven|Clair de Lune=Claude Debussy|The Blue Danube=Johann Strauss II|
Bolero=Maurice Ravel"""),
}
# Checked names where a maker's last word would be wrong or too common a word.
CHECKS = {"Homer": ("Homer",), "Michelangelo": ("Michelangelo",), "Rembrandt": ("Rembrandt",),
          "Dr. Seuss": ("Seuss",), "the Wright brothers": ("Wright",), "Alexander Graham Bell": ("Graham Bell", "Bell"),
          "Leonardo da Vinci": ("Leonardo", "da Vinci"), "Vincent van Gogh": ("van Gogh", "Gogh"),
          "Ludwig van Beethoven": ("Beethoven",), "Johann Strauss II": ("Strauss",), "Watson and Crick": ("Watson", "Crick"),
          "E. B. White": ("E. B. White", "E.B. White"), "Harper Lee": ("Harper Lee",), "Mary Shelley": ("Mary Shelley", "Shelley"),
          "Tim Berners-Lee": ("Berners-Lee",), "Galileo Galilei": ("Galileo",), "Dante Alighieri": ("Dante",),
          "Antoine de Saint-Exupéry": ("Saint-Exupéry", "Saint-Exupery"), "Salvador Dalí": ("Dalí", "Dali"),
          "Charlotte Brontë": ("Charlotte Brontë", "Charlotte Bronte"), "Emily Brontë": ("Emily Brontë", "Emily Bronte")}

FRAMES = {
    "wrote": "Who wrote {w}?|Who is the author of {w}?|Who was {w} written by?|Do you know who wrote {w}?|"
             "Which writer gave us {w}?|I forgot who wrote {w}. Who was it?",
    "painted": "Who painted {w}?|Which artist painted {w}?|Do you know who painted {w}?|Who was the painter of {w}?",
    "invented": "Who invented {w}?|Who is credited with inventing {w}?|Do you know who invented {w}?|"
                "Which inventor gave us {w}?",
    "discovered": "Who discovered {w}?|Which scientist discovered {w}?|Do you know who discovered {w}?|"
                  "Who came up with {w}?",
    "composed": "Who composed {w}?|Which composer wrote {w}?|Do you know who composed {w}?",
}
AGAIN = "And who {verb} {w}?|What about {w}?|And {w}?|Now tell me who {verb} {w}."
# Follow-ups about the maker or the work, once named ({m}: the maker, {w}: the work).
MORE = {
    "wrote": "What is {w} about?|When was {w} written?|What else did {m} write?|Is {w} worth reading?|"
             "Where was {m} from?",
    "painted": "Where can I see {w}?|What else did {m} paint?|Why is {w} so famous?|When did {m} live?",
    "invented": "Why was {w} important?|When did that happen?|What else is {m} known for?|Where was {m} from?",
    "discovered": "Why does that matter?|When did that happen?|What else is {m} known for?",
    "composed": "What else did {m} compose?|When did {m} live?|What does {w} sound like?",
}


def checks(maker: str) -> tuple[str, ...]:
    """The names one of which a right answer contains (whole word, any case)."""
    return CHECKS.get(maker, (maker.split()[-1],))


def items(held_out: Callable[[str, str], bool], probe_side: bool = False) -> list[tuple[str, str, str]]:
    """(verb, work, maker) of the works on one side of the probe split, in a stable order."""
    return [(verb, w, m) for verb, table in MADE_BY.items() for w, m in table.items()
            if held_out(w, "creator") == probe_side]


def question(rng: random.Random, verb: str, work: str) -> str:
    frame = rng.choice(topic_lists.split(FRAMES[verb]))
    return _capitalised(frame.format(w=work))


def again(rng: random.Random, verb: str, work: str) -> str:
    frame = rng.choice(topic_lists.split(AGAIN))
    return _capitalised(frame.format(verb=verb, w=work))


def more(rng: random.Random, verb: str, work: str, maker: str) -> str:
    frames = topic_lists.split(MORE[verb])
    if " and " in maker or maker.endswith("brothers"):       # "What else is {m} known for?" needs one person
        frames = [f for f in frames if "{m}" not in f]
    return _capitalised(rng.choice(frames).format(w=work, m=maker))


def _capitalised(text: str) -> str:
    return text[0].upper() + text[1:]
