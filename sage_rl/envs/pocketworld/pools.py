"""Word pools the generator samples from. Plain tuples: order is fixed, so sampling is deterministic."""

FIRST_NAMES = (
    "Alice", "Bruno", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Isabel", "Jamal", "Kira", "Liam",
    "Maya", "Nikolai", "Olivia", "Pedro", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera", "Wes", "Ximena",
    "Yusuf", "Zoe", "Amara", "Ben", "Carmen", "Dev", "Emeka", "Fiona", "Gus", "Hana", "Ivan", "Julia",
    "Kwame", "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Rafael", "Sofia", "Theo", "Uma", "Victor", "Wanda",
    "Yara", "Zane", "Aisha", "Boris", "Clara", "Diego", "Esther", "Felix", "Gemma", "Hugo", "Ines", "Jonas",
    "Kai", "Luz", "Milo", "Noor", "Pia", "Reza",
)  # fmt: skip
LAST_NAMES = (
    "Adams", "Baker", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jensen", "Khan", "Lopez",
    "Moreau", "Nakamura", "Okafor", "Patel", "Quist", "Rossi", "Silva", "Tanaka", "Ueda", "Vargas", "Weber",
    "Young", "Zhang", "Novak", "Kowalski", "Murphy", "Ahmed", "Berg",
)  # fmt: skip
DOMAINS = ("pocketmail.com", "inbox.net", "mailbox.org")
#: How many contacts of each relationship a world has, drawn per world from [lo, hi] (issue 30:
#: fixed counts made "how many friends do I have" a constant answer).
RELATIONSHIP_RANGES = (("roommate", 1, 4), ("family", 2, 16), ("friend", 4, 20), ("coworker", 4, 20))

GENRES = ("pop", "rock", "jazz", "hip-hop", "classical", "electronic", "country", "indie")
ARTIST_NAMES = (
    "The Night Owls", "Luna Park", "Marco Vell", "Static Bloom", "Ada Rivers", "Blue Harbor", "Kofi Mensah",
    "Paper Lanterns", "Iris Kwan", "The Foxgloves", "DJ Meridian", "Sol & Sea", "Hollow Pines", "Nadia Frost",
    "Echo Valley", "Rui Santos", "Velvet Arcade", "Oskar Lind", "Coral Drive", "Mira Solis", "The Lamplighters",
    "Jonah Reyes", "Northern Atlas", "Saffron Kite", "Tomas Weir", "Glass Orchard", "Lea Moreno", "Cinder Bay",
    "Amani Cole", "The Quiet Hours",
)  # fmt: skip
SONG_ADJ = (
    "Golden", "Midnight", "Electric", "Silent", "Wild", "Broken", "Neon", "Endless", "Falling", "Lonely",
    "Summer", "Crystal", "Hidden", "Burning", "Paper", "Velvet", "Distant", "Restless",
)  # fmt: skip
SONG_NOUN = (
    "Hearts", "Skies", "River", "Dreams", "Echoes", "Lights", "Roads", "Waves", "Shadows", "Fire", "Garden",
    "Stars", "Rain", "Mirror", "Horizon", "Whispers",
)  # fmt: skip
PLAYLIST_TITLES = (
    "Road Trip",
    "Workout",
    "Chill Evening",
    "Focus",
    "Party Mix",
    "Morning Coffee",
    "Rainy Day",
    "Throwbacks",
)

PAYMENT_NOTES = (
    "dinner", "movie tickets", "groceries", "concert", "rent share", "coffee", "gas money", "birthday gift",
    "pizza night", "utilities", "taxi", "book club",
)  # fmt: skip
TEXT_LINES = (
    "Are we still on for tomorrow?", "Running 10 minutes late!", "Did you see the game last night?",
    "Can you call me when you're free?", "Thanks again for dinner!", "Happy Friday!", "Just landed.",
    "Don't forget the keys.", "Let's grab lunch this week.", "Sent you the photos.", "On my way.",
    "Can you pick up milk?", "Call you back in five.", "Good luck today!", "Where did you park?",
    "Movie tonight?", "The package arrived.", "Happy birthday!", "Meeting moved to 3pm.", "Miss you already.",
    "Did you feed the cat?", "Traffic is terrible.", "Save me a seat.", "Great job on the talk!",
    "Bring an umbrella.", "Let me know when you're home.", "Dinner is ready.", "Check your email.",
    "See you at the gym.", "Thanks for the ride!",
)  # fmt: skip
ALARM_LABELS = ("Wake up", "Gym", "Meds", "Standup", "Pick up kids", "Water plants", "Leave for work")
EMAIL_SUBJECTS = (
    "Quarterly report", "Weekend plans", "Invoice #{n}", "Project kickoff", "Team offsite", "Photos from the trip",
    "Book recommendation", "Dinner on Saturday?", "Budget review", "Your order has shipped", "Meeting notes",
    "Welcome aboard", "Flight itinerary", "Reminder: dentist appointment", "Newsletter #{n}",
)  # fmt: skip
EMAIL_BODIES = (
    "Please find the details below. Let me know what you think.", "Looking forward to it!",
    "Can you take a look before Friday?", "Here is the summary we discussed.", "Let me know if this works for you.",
)  # fmt: skip
SERVICE_SENDERS = (("newsletter@dailybrief.com", "Daily Brief"), ("noreply@pocketbank.com", "Pocket Bank"))

NOTE_TAGS = ("recipes", "work", "ideas", "travel", "books", "shopping", "health")
NOTE_TITLES = (
    "Pasta recipe", "Sprint goals", "App idea", "Packing list", "Books to read", "Gift ideas", "Workout plan",
    "Meeting prep", "Garden plans", "Lisbon trip", "Soup recipe", "Podcast list", "Budget 2026", "Reading notes",
    "Weekend errands", "Interview questions", "Bread recipe", "Quarterly goals", "Side project", "Camping gear",
    "Film list", "Holiday gifts", "Running log", "Team retro", "Balcony herbs", "Tokyo trip", "Curry recipe",
    "Album list", "Tax checklist", "Poetry notes", "Moving checklist", "Onboarding notes", "Salad recipe",
    "Roadmap draft", "Startup idea", "Ski trip", "Novel ideas", "Wine list", "Yoga routine", "One-on-one notes",
    "Seed list", "Rome trip", "Cake recipe", "Course notes", "Savings plan", "Car maintenance", "Hiring plan",
    "Birthday plans", "Language practice", "Conference notes",
)  # fmt: skip
TODO_LISTS = ("Personal", "Work", "Home", "Errands")
TODO_TITLES = (
    "Pay electricity bill", "Book dentist", "Renew passport", "Clean garage", "Call the bank", "Buy printer ink",
    "Submit expense report", "Prepare slides", "Water the plants", "Fix bike tire", "Order birthday cake",
    "Update resume", "Return library books", "Schedule car service", "Back up laptop", "Plan team lunch",
    "Reply to landlord", "Cancel gym trial", "Pick up dry cleaning", "Review contract", "Buy groceries",
    "Mow the lawn", "Book flights", "Send thank-you cards", "File taxes", "Defrost the freezer", "Clean gutters",
    "Sort old photos", "Replace smoke alarm battery", "Donate old clothes", "Order new glasses",
    "Renew car insurance", "Fix leaky faucet", "Write project update", "Archive old emails", "Paint the fence",
    "Buy a gift for mom", "Organize the closet", "Read the onboarding doc", "Plan weekend hike",
    "Check tire pressure", "Vacuum the car", "Repot the ficus", "Set up new router", "Cancel old subscription",
    "Print boarding passes", "Shred old bills", "Refill prescriptions", "Book a haircut", "Wash the windows",
    "Hang the new shelf", "Review pull requests", "Prepare quarterly review", "Clean the oven",
    "Pack for the trip", "Recycle batteries",
)  # fmt: skip

PRODUCT_CATEGORIES = ("electronics", "books", "kitchen", "sports", "toys", "beauty", "garden")
PRODUCT_WORDS = {
    "electronics": (
        "Wireless Earbuds",
        "USB-C Charger",
        "Smart Speaker",
        "Phone Stand",
        "Power Bank",
        "Webcam",
    ),
    "books": (
        "Mystery Novel",
        "Cookbook",
        "Travel Guide",
        "Poetry Collection",
        "Sci-Fi Epic",
        "History Atlas",
    ),
    "kitchen": ("Chef Knife", "French Press", "Cast Iron Pan", "Spice Rack", "Cutting Board", "Tea Kettle"),
    "sports": ("Yoga Mat", "Running Socks", "Water Bottle", "Jump Rope", "Tennis Balls", "Bike Light"),
    "toys": ("Puzzle Set", "Building Blocks", "Plush Bear", "Kite", "Board Game", "Toy Train"),
    "beauty": ("Face Cream", "Shampoo Bar", "Lip Balm", "Sunscreen", "Hair Brush", "Bath Salts"),
    "garden": ("Seed Pack", "Garden Gloves", "Watering Can", "Plant Pot", "Pruning Shears", "Bird Feeder"),
}
FILE_DIRS = {
    "/documents": ("txt", "pdf", "docx"),
    "/documents/taxes": ("pdf", "csv"),
    "/photos": ("jpg", "png"),
    "/photos/trips": ("jpg",),
    "/downloads": ("pdf", "zip", "jpg", "csv"),
    "/work": ("docx", "txt", "csv"),
}
FILE_STEMS = (
    "report", "invoice", "notes", "summary", "receipt", "plan", "budget", "draft", "scan", "photo", "letter",
    "contract", "agenda", "list", "statement", "slides",
)  # fmt: skip
GROUP_NAMES = ("Apartment", "Ski Trip", "Office Lunch")
EXPENSE_ITEMS = (
    "Groceries",
    "Internet bill",
    "Cleaning supplies",
    "Dinner",
    "Cabin rental",
    "Gas",
    "Lunch",
    "Snacks",
    "Lift tickets",
    "Pizza",
)
