"""Entity lists and fact tables for the v2 prompts (plain data, our own; "|"-separated to keep the file short).

The lists name things people ask a chat assistant about (animals, foods, everyday objects, places, jobs, hobbies,
tasks); the tables hold facts with one checkable answer (an animal's legs, a thing's colour, a word's opposite), so
that a teacher reply to such a question can be kept only when it contains the answer. Countries and capitals come
from the ``countryinfo`` package and jobs from ``faker`` (see :mod:`tinychat.training.questions`).
"""
from __future__ import annotations


def split(s: str) -> list[str]:
    return [x.strip() for x in s.split("|") if x.strip()]


def table(s: str) -> dict[str, str]:
    """"key=value|key=value" -> {key: value}."""
    out = {}
    for item in split(s):
        k, _, v = item.partition("=")
        out[k.strip()] = v.strip()
    return out


ANIMALS = split("""
dog|cat|horse|cow|pig|sheep|goat|chicken|duck|goose|turkey|rabbit|hamster|guinea pig|mouse|rat|squirrel|deer|
moose|elk|bear|polar bear|panda|koala|kangaroo|wombat|platypus|lion|tiger|leopard|cheetah|jaguar|wolf|fox|coyote|
hyena|zebra|giraffe|elephant|rhino|hippo|camel|llama|alpaca|monkey|gorilla|chimpanzee|orangutan|sloth|bat|hedgehog|
beaver|otter|raccoon|skunk|badger|mole|seal|walrus|sea lion|dolphin|whale|shark|octopus|squid|jellyfish|starfish|
crab|lobster|shrimp|clam|snail|slug|earthworm|ant|bee|wasp|butterfly|moth|dragonfly|ladybug|grasshopper|cricket|
beetle|spider|scorpion|mosquito|fly|frog|toad|salamander|newt|turtle|tortoise|lizard|gecko|iguana|chameleon|snake|
cobra|python|crocodile|alligator|eagle|hawk|owl|parrot|penguin|ostrich|flamingo|peacock|pigeon|crow|robin|sparrow|
swan|hummingbird|woodpecker|seagull|pelican|goldfish|salmon|tuna|trout|eel|seahorse|clownfish|porcupine|armadillo
""")

ANIMAL_LEGS = table("""
dog=4|cat=4|horse=4|cow=4|pig=4|sheep=4|goat=4|chicken=2|duck=2|rabbit=4|mouse=4|lion=4|tiger=4|elephant=4|
giraffe=4|zebra=4|bear=4|wolf=4|fox=4|deer=4|camel=4|kangaroo=2|penguin=2|ostrich=2|owl=2|eagle=2|parrot=2|
spider=8|ant=6|bee=6|butterfly=6|ladybug=6|beetle=6|fly=6|mosquito=6|grasshopper=6|scorpion=8|crab=10|lobster=10|
octopus=8|frog=4|turtle=4|lizard=4|crocodile=4|snake=0|starfish=5|flamingo=2|swan=2|goose=2|turkey=2|monkey=4
""")

ANIMAL_SOUNDS = table("""
dog=bark|cat=meow|cow=moo|pig=oink|sheep=baa|duck=quack|horse=neigh|chicken=cluck|rooster=crow|lion=roar|
owl=hoot|snake=hiss|frog=croak|bee=buzz|mouse=squeak|wolf=howl|goat=bleat|donkey=bray|turkey=gobble|crow=caw|
dove=coo|elephant=trumpet|bird=chirp|pigeon=coo|goose=honk
""")

BABY_ANIMALS = table("""
cat=kitten|dog=puppy|cow=calf|horse=foal|sheep=lamb|goat=kid|pig=piglet|duck=duckling|goose=gosling|frog=tadpole|
bear=cub|lion=cub|tiger=cub|kangaroo=joey|deer=fawn|swan=cygnet|owl=owlet|chicken=chick|elephant=calf|whale=calf|
rabbit=kit|eagle=eaglet|fox=kit|seal=pup
""")

COLOURS_OF = table("""
banana=yellow|lemon=yellow|grass=green|the sky on a clear day=blue|snow=white|coal=black|a strawberry=red|
a tomato=red|a carrot=orange|an orange=orange|chocolate=brown|milk=white|a ripe cherry=red|a lime=green|
a school bus in the United States=yellow|a fire truck=red|a polar bear's fur=white|a crow=black|a pumpkin=orange|
a cucumber=green|an eggplant=purple|a flamingo=pink|blood=red|a zebra's stripes=black|the sun in drawings=yellow|
a frog=green|the ocean=blue|a lemon's peel=yellow|a raven=black|cotton=white|a broccoli=green|a blueberry=blue|
an emerald=green|a ruby=red|a sapphire=blue|a leaf in summer=green|coffee=brown|a swan=white|a canary=yellow|
a grape=purple|a pea=green|a cloud on a sunny day=white|an egg yolk=yellow|a stop sign=red|a tiger=orange
""")

OPPOSITES = table("""
hot=cold|big=small|tall=short|fast=slow|happy=sad|light=dark|up=down|open=closed|full=empty|hard=soft|wet=dry|
early=late|old=young|heavy=light|loud=quiet|rich=poor|strong=weak|thick=thin|high=low|day=night|inside=outside|
win=lose|push=pull|true=false|clean=dirty|easy=difficult|begin=end|before=after|left=right|awake=asleep|
friend=enemy|love=hate|buy=sell|give=take|laugh=cry|near=far|arrive=leave|sweet=sour|north=south|east=west|
top=bottom|first=last|more=less|always=never|remember=forget|ask=answer|wide=narrow|deep=shallow|brave=cowardly|
beautiful=ugly|cheap=expensive|safe=dangerous|noisy=quiet|question=answer|summer=winter|entrance=exit|float=sink|
polite=rude|smooth=rough|sharp=dull|gain=lose|accept=refuse|victory=defeat|ancient=modern|asleep=awake
""")

FOODS = split("""
pizza|pasta|spaghetti|lasagna|rice|bread|toast|pancakes|waffles|oatmeal|cereal|yogurt|cheese|butter|eggs|omelette|
bacon|sausage|ham|chicken soup|tomato soup|salad|sandwich|hamburger|hot dog|french fries|tacos|burritos|sushi|
ramen|noodles|dumplings|curry|stir-fry|fried rice|falafel|hummus|pita bread|bagels|croissants|muffins|cupcakes|
cookies|brownies|chocolate cake|cheesecake|apple pie|ice cream|popcorn|potato chips|peanut butter|jam|honey|
apples|bananas|oranges|grapes|strawberries|blueberries|watermelon|pineapple|mango|peaches|pears|cherries|lemons|
avocados|tomatoes|carrots|broccoli|spinach|potatoes|sweet potatoes|onions|garlic|mushrooms|peppers|corn|peas|beans|
lentils|chickpeas|tofu|salmon|tuna|shrimp|steak|meatballs|chili|soup|smoothies|milkshakes|lemonade|tea|coffee|
hot chocolate|orange juice|milk|water|nuts|almonds|walnuts|oranges|kiwis|coconut|dates|figs|plums|pumpkin pie|
granola|porridge|quinoa|couscous|paella|risotto|pesto|guacamole|salsa|nachos|quesadillas|kebabs|pretzels|donuts
""")

OBJECTS = split("""
umbrella|backpack|bicycle|skateboard|guitar|piano|violin|drum|camera|telescope|microscope|compass|map|clock|watch|
calendar|notebook|pencil|pen|eraser|ruler|scissors|stapler|calculator|computer|laptop|keyboard|mouse pad|printer|
smartphone|headphones|television|radio|remote control|lamp|candle|flashlight|battery|light bulb|fan|air conditioner|
heater|refrigerator|oven|microwave|toaster|kettle|blender|frying pan|teapot|mug|fork|spoon|knife|plate|bowl|
chopsticks|washing machine|vacuum cleaner|broom|mop|bucket|hammer|screwdriver|wrench|saw|drill|ladder|rope|tent|
sleeping bag|kite|balloon|puzzle|chessboard|dice|deck of cards|ball|bicycle helmet|sunglasses|hat|scarf|gloves|
boots|sneakers|raincoat|sweater|mirror|toothbrush|toothpaste|soap|towel|pillow|blanket|alarm clock|bookshelf|desk|
chair|sofa|bed|door|window|key|lock|wallet|coin|stamp|envelope|suitcase|car|bus|train|airplane|boat|submarine|
rocket|helicopter|tractor|motorcycle|scooter|wheelchair|elevator|escalator|bridge|lighthouse|windmill|solar panel|
thermometer|magnet|mirror|paintbrush|sewing machine|needle|thread|button|zipper|glue|tape|paper clip|globe
""")

PLACES = split("""
the beach|the mountains|a forest|a desert|a big city|a small village|a farm|a library|a museum|a zoo|an aquarium|
a park|a playground|a hospital|a school|a university|an airport|a train station|a supermarket|a bakery|a restaurant|
a cafe|a cinema|a theater|a stadium|a gym|a swimming pool|a post office|a bank|a fire station|a police station|
a castle|a lighthouse|an island|a lake|a river|a waterfall|a cave|a volcano|a jungle|the Arctic|Antarctica|
the moon|space|a rainforest|a coral reef|a campsite|a market|a bookstore|a garden|a kitchen|an office
""")

HOBBIES = split("""
reading|writing|drawing|painting|photography|gardening|cooking|baking|knitting|sewing|woodworking|pottery|
hiking|camping|fishing|cycling|running|swimming|yoga|dancing|singing|playing the guitar|playing the piano|
playing chess|board games|video games|puzzles|birdwatching|stargazing|collecting stamps|collecting coins|
learning languages|coding|building model airplanes|origami|calligraphy|journaling|skateboarding|surfing|
rock climbing|skiing|snowboarding|ice skating|tennis|basketball|soccer|volleyball|table tennis|badminton|
bowling|golf|martial arts|boxing|meditation|volunteering|traveling|blogging|podcasting|magic tricks|juggling
""")

SPORTS = split("""soccer|basketball|tennis|baseball|volleyball|swimming|running|cycling|golf|boxing|skiing|surfing|
hockey|rugby|cricket|table tennis|badminton|gymnastics|wrestling|rowing|sailing|climbing|skating|archery|fencing""")

INSTRUMENTS = split("""piano|guitar|violin|cello|drums|flute|clarinet|saxophone|trumpet|trombone|harp|ukulele|
banjo|harmonica|accordion|xylophone|bass guitar|tuba|oboe|bagpipes""")

SUBJECTS = split("""math|history|geography|biology|chemistry|physics|art|music|literature|economics|psychology|
philosophy|computer science|astronomy|geology|sociology|statistics|grammar|poetry|architecture""")

TASKS = split("""
boil an egg|make a cup of tea|make pancakes|cook rice|bake cookies|make a salad|make a smoothie|plant a tree|
grow tomatoes|water houseplants|clean a window|do laundry|iron a shirt|sew a button|fold a fitted sheet|
tie a tie|tie my shoes|change a light bulb|fix a flat bicycle tire|wrap a present|write a thank-you note|
write a resume|prepare for a job interview|start a budget|save for a vacation|open a bank account|
learn to juggle|learn to whistle|learn to swim|learn to ride a bike|learn to type faster|memorize a poem|
study for a test|take good notes|read faster|fall asleep faster|wake up early|stop snoring|make new friends|
remember names|start a conversation|give a good speech|calm down when angry|meditate|stretch after running|
warm up before exercise|build a snowman|make a paper airplane|fold a paper boat|draw a cat|draw a tree|
paint a sunset|take a good photo|pack a suitcase|plan a road trip|read a map|use a compass|build a campfire|
set up a tent|make a bird feeder|clean my keyboard|back up my phone|make a strong password|write an email|
organize my desk|declutter my closet|make my bed|get rid of hiccups|cure a headache|treat a small cut|
keep a plant alive|train a puppy to sit|teach a dog a trick|care for a goldfish|make lemonade|make popcorn|
make a sandwich|make hot chocolate|make a pizza at home|decorate a cake|carve a pumpkin|make a snow angel|
skip a stone|fly a kite|blow a big bubble|play chess|solve a Rubik's cube|play a card game|learn a magic trick
""")

TRAITS = split("""kind|funny|patient|honest|brave|curious|creative|calm|friendly|generous|polite|careful|
cheerful|clever|gentle|hardworking|loyal|shy|confident|thoughtful""")

NAMES_EXTRA = split("""Ava|Liam|Noah|Emma|Mia|Lucas|Zoe|Leo|Aria|Omar|Yuki|Priya|Mateo|Sofia|Kenji|Amara|Ivan|
Nadia|Tariq|Elena|Ravi|Hana|Diego|Freya|Kwame|Lina|Marco|Ines|Tomas|Nia""")

NUMBER_WORDS = split("""zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|
fifteen|sixteen|seventeen|eighteen|nineteen|twenty""")

WEEKDAYS = split("Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday")
MONTHS = split("January|February|March|April|May|June|July|August|September|October|November|December")

LANGUAGE_NAMES = table("""
en=English|fr=French|de=German|es=Spanish|pt=Portuguese|it=Italian|nl=Dutch|ru=Russian|uk=Ukrainian|pl=Polish|
cs=Czech|sk=Slovak|hu=Hungarian|ro=Romanian|bg=Bulgarian|el=Greek|tr=Turkish|ar=Arabic|he=Hebrew|fa=Persian|
hi=Hindi|bn=Bengali|ur=Urdu|ta=Tamil|zh=Chinese|ja=Japanese|ko=Korean|vi=Vietnamese|th=Thai|id=Indonesian|
ms=Malay|sw=Swahili|sv=Swedish|no=Norwegian|nb=Norwegian|da=Danish|fi=Finnish|is=Icelandic|ga=Irish|hr=Croatian|
sr=Serbian|sl=Slovene|lt=Lithuanian|lv=Latvian|et=Estonian|am=Amharic|ne=Nepali|si=Sinhala|my=Burmese|
km=Khmer|lo=Lao|mn=Mongolian|ka=Georgian|hy=Armenian|az=Azerbaijani|kk=Kazakh|uz=Uzbek|tl=Tagalog|so=Somali
""")
